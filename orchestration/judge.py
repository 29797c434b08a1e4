"""Serve a `judge` reward term from our own engines: wire the rewards package's judge to a rollout server.

`rewards/judge.py` only knows the `JudgeEngine` protocol; here the driver builds one over
- the training engine (`engine: policy`): the rubric goes to the base model, never the adapter being trained, so
  the grader does not drift with the policy it grades;
- a separate engine (`engine: judge`): its own model behind its own RolloutServer actor (the run config's
  `judge_engine:`), started beside the training engine and stopped with it.
Rubrics are rendered with the judge model's tokenizer (its chat template unless the term says `chat: false`), and
a rubric too long for the engine's context is that sample's error, not the batch's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rewards.judge import JudgeParams, JudgeReply, JudgeReward
from rewards.registry import RewardSet
from rollout.capabilities import takes_request_seeds
from rollout.config import RolloutConfig
from common.sampling import SamplingParams

if TYPE_CHECKING:
    from orchestration.config.schema import RunConfig

log = logging.getLogger(__name__)


class EngineJudge:
    """A `JudgeEngine` over one rollout handle (a `Rollout` or a `RolloutFleet`), always with the base model."""

    def __init__(self, rollout, model_path: Path, backend):
        from transformers import AutoTokenizer  # tokenizers only

        self.rollout = rollout
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.max_model_len = backend.max_model_len
        self.seeds = takes_request_seeds(backend)

    def encode(self, prompt: str | list[dict[str, str]]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("the judge model's tokenizer has no chat template; set the judge term's chat: false")
        text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def complete(self, prompts: Sequence[str | list[dict[str, str]]], params: SamplingParams,
                 seeds: list[int]) -> list[JudgeReply | Exception]:
        ids = [self.encode(p) for p in prompts]
        room = self.max_model_len - params.max_tokens
        fits = [i for i, x in enumerate(ids) if len(x) <= room]
        out: list[JudgeReply | Exception] = [
            ValueError(f"judge rubric of {len(x)} tokens + max_tokens {params.max_tokens} exceeds the judge engine's "
                       f"max_model_len ({self.max_model_len}); shorten the template or raise max_model_len")
            for x in ids]
        if fits:
            groups = self.rollout.generate([ids[i] for i in fits], params,
                                           seeds=[seeds[i] for i in fits] if self.seeds else None)
            for i, [reply] in zip(fits, groups):
                out[i] = JudgeReply(reply.text, len(ids[i]), len(reply.token_ids))
        return out


def judge_term(rewards: RewardSet) -> JudgeReward | None:
    """The run's judge reward, if it has one (reward names are unique, so at most one)."""
    return next((fn for fn in rewards.fns if isinstance(fn, JudgeReward)), None)


def start_judge_engine(cfg: RunConfig):
    """The separate judge engine of `judge_engine:` (a started `Rollout` behind its own actor)."""
    from rollout.handle import Rollout

    section = cfg.judge_engine
    params = JudgeParams(**next(t.params for t in cfg.rewards.terms if t.name == "judge"))
    part = RolloutConfig(backend=section.backend, client=section.client, sampling=params.sampling)
    rollout = Rollout(part, section.model.resolved_path, section.resources.ray_options())
    url = rollout.start()
    log.info("judge engine (%s, %s) ready at %s", section.backend.kind, section.model.path, url)
    return rollout


def setup_judge(cfg: RunConfig, rewards: RewardSet, policy_rollout):
    """Bind the run's judge term (if any) to its engine; returns the judge engine it started (stop it at the end),
    or None when the judge uses the training engine or there is no judge."""
    judge = judge_term(rewards)
    if judge is None:
        return None
    if judge.params.engine == "policy":
        judge.bind(EngineJudge(policy_rollout, cfg.model.resolved_path, cfg.rollout.backend))
        return None
    started = start_judge_engine(cfg)
    judge.bind(EngineJudge(started, cfg.judge_engine.model.resolved_path, cfg.judge_engine.backend))
    return started


def judge_step_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The judge's derived figures of a step row: tokens/s while judging and its share of the step's wall time."""
    seconds = metrics.get("judge/seconds")
    if seconds is None:
        return {}
    tokens = metrics["judge/prompt_tokens"] + metrics["judge/completion_tokens"]
    out = {"judge/tokens_per_s": tokens / seconds if seconds else 0.0,
           "judge/completion_tokens_per_s": metrics["judge/completion_tokens"] / seconds if seconds else 0.0}
    if metrics.get("timing/step"):
        out["judge/step_share"] = seconds / metrics["timing/step"]
    return out
