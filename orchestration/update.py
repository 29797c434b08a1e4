"""A step's learner update: its scored groups as advantages, mini-batches and epochs of primitive calls, their
metrics, and the first update's engine check.

The learner knows losses, not rewards (as in prime-rl, Tunix and OpenRLHF, the advantages are the trainer loop's):
1. group-relative advantages from the rewards (Dr. GRPO: mean-centred only);
2. with `skip_zero_variance_groups`, the groups whose rewards are all equal left out (their advantage is 0);
3. the samples split into mini-batches of `mini_batch_size` (the whole batch by default), each a TrainBatch;
4. the update, as the Tinker API's calls: on-policy (one mini-batch, one epoch) forward_backward + optim_step;
   otherwise one `forward` per mini-batch first (the logprobs before any update, which every later ratio is taken
   against), then forward_backward(mini, old) + optim_step for each mini-batch of each epoch.
`update_calls` drives a LearnerHandle (its calls return `Pending`s at once) or a Learner (they return results):
`update_metrics` merges what they answered into the step's `learner/...` row.

The engine check: at the first step of a run the learner scores the engine's own samples, so
`learner/logprob_abs_diff` (per token) measures how far the learner's model is from the engine's before any
training. A broken family mapping shows up there (gemma3 once gave 0.42/token with exit 0): every importance weight
and PPO ratio would then be meaningless, so the run stops with one line naming the family and the gap instead of
training on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from learner.batch import TrainBatch
from learner.config import GrpoConfig
from learner.sampling import SamplingTransform
from orchestration.config.schema import RunConfig


@dataclass(frozen=True)
class ScoredSamples:
    """A step's samples, flattened group by group, with their rewards (`TrainBatch`'s fields but the rewards)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    engine_logprobs: list[list[float]]
    rewards: np.ndarray  # [B]
    group_ids: np.ndarray  # [B]; samples of one prompt share an id
    sampling: SamplingTransform = SamplingTransform()
    completion_mask: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def with_advantages(self, advantages: np.ndarray) -> TrainBatch:
        return TrainBatch(self.prompt_ids, self.completion_ids, self.engine_logprobs, advantages, self.group_ids,
                          self.sampling, self.completion_mask)


@dataclass(frozen=True)
class UpdatePlan:
    """The mini-batches of one step's update, how many passes over them, and the advantage metrics."""

    minis: list[TrainBatch]
    epochs: int
    metrics: dict[str, float]

    @property
    def on_policy(self) -> bool:
        return self.epochs == 1 and len(self.minis) == 1


def group_advantages(rewards: np.ndarray, group_ids: np.ndarray, std_normalize: bool,
                     eps: float = 1e-6) -> np.ndarray:
    """Group-relative advantages: centre on the group mean; divide by the group std (ddof=1, + eps, as Tunix)
    unless Dr. GRPO."""
    rewards = np.asarray(rewards, np.float64)
    group_ids = np.asarray(group_ids)
    adv = np.zeros_like(rewards)
    for g in np.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx]
        centred = r - r.mean()
        if std_normalize:
            std = r.std(ddof=1) if len(r) > 1 else 0.0
            centred = centred / (std + eps)
        adv[idx] = centred
    return adv.astype(np.float32)


def constant_reward_groups(rewards: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """bool [B]: samples whose group's rewards are all equal, so their advantage is 0 whatever the GRPO variant."""
    rewards, group_ids = np.asarray(rewards, np.float64), np.asarray(group_ids)
    constant = np.zeros(len(rewards), bool)
    for g in np.unique(group_ids):
        idx = group_ids == g
        constant[idx] = np.ptp(rewards[idx]) == 0
    return constant


def plan_update(grpo: GrpoConfig, scored: ScoredSamples) -> UpdatePlan:
    """Steps 1-3 of the module docstring."""
    batch = scored.with_advantages(group_advantages(scored.rewards, scored.group_ids, grpo.std_normalize))
    constant = constant_reward_groups(scored.rewards, scored.group_ids)
    groups = np.asarray(scored.group_ids)
    zero_adv_frac = len(np.unique(groups[constant])) / len(np.unique(groups))
    if grpo.skip_zero_variance_groups and constant.any() and not constant.all():
        batch = batch.take(np.flatnonzero(~constant))
    size = grpo.mini_batch_size or len(batch)
    minis = [batch.take(np.arange(lo, min(lo + size, len(batch)))) for lo in range(0, len(batch), size)]
    metrics = {"learner/adv_std": float(np.std(batch.advantages)), "learner/zero_adv_frac": zero_adv_frac}
    return UpdatePlan(minis, grpo.epochs, metrics)


def update_calls(learner: Any, plan: UpdatePlan) -> list[tuple[Any, Any]]:
    """Step 4: the update's (forward_backward, optim_step) answers, in order (`Pending`s from a LearnerHandle)."""
    olds = [None if plan.on_policy else learner.forward(mini, "grpo") for mini in plan.minis]
    return [(learner.forward_backward(mini, "grpo", old=old), learner.optim_step())
            for _ in range(plan.epochs) for mini, old in zip(plan.minis, olds)]


def update_metrics(plan: UpdatePlan, answers: list[tuple[dict, dict]]) -> dict[str, float]:
    """The step's `learner/...` row from every call's answer: per-token means weighted by each batch's tokens (as
    one pass over all of them would give), the loss and grad norm averaged over updates, times summed."""
    passes = [fb for fb, _ in answers]
    tokens = np.array([fb["learner/completion_tokens"] for fb in passes])
    weights = tokens / max(tokens.sum(), 1.0)
    per_token = [k for k in passes[0] if k not in ("learner/loss", "learner/completion_tokens",
                                                   "learner/trained_samples")]
    out = {k: float(sum(w * fb[k] for w, fb in zip(weights, passes))) for k in per_token}
    first_epoch = passes[: len(plan.minis)]
    out["learner/loss"] = float(np.mean([fb["learner/loss"] for fb in passes]))
    out["learner/completion_tokens"] = float(sum(fb["learner/completion_tokens"] for fb in first_epoch))
    out["learner/trained_samples"] = float(sum(fb["learner/trained_samples"] for fb in first_epoch))
    out["learner/grad_norm"] = float(np.mean([opt["learner/grad_norm"] for _, opt in answers]))
    out["learner/updates"] = float(len(answers))
    out["learner/step_s"] = float(sum(opt["learner/step_s"] for _, opt in answers))
    out["learner/compile_s"] = float(sum(opt["learner/compile_s"] for _, opt in answers))
    return {**out, **plan.metrics}


def grpo_step(learner: Any, grpo: GrpoConfig, scored: ScoredSamples) -> dict[str, float]:
    """One whole GRPO update on a Learner (in-process: tests and benchmarks) or a LearnerHandle; its metrics."""
    plan = plan_update(grpo, scored)
    answers = [(_result(fb), _result(opt)) for fb, opt in update_calls(learner, plan)]
    return update_metrics(plan, answers)


def _result(answer: Any) -> Any:
    return answer.result() if hasattr(answer, "result") else answer


class EngineMismatchError(RuntimeError):
    """The learner's model is not the engine's (family config mapping or weights differ)."""


def check_engine_agreement(cfg: RunConfig, steps_done: int, metrics: dict[str, float]) -> None:
    """On the first step of this process (`steps_done` == 1), raise if the gap exceeds the learner's bound."""
    bound = cfg.learner.engine_gap_bound
    gap = metrics.get("learner/logprob_abs_diff")
    if steps_done != 1 or bound is None or gap is None or gap <= bound:
        return
    from learner.model import family_of, read_hf_config

    family = family_of(read_hf_config(cfg.model.resolved_path))
    raise EngineMismatchError(
        f"{family}: learner and engine logprobs differ by {gap:.3g} per token at the first step (bound {bound:g}, "
        f"learner.max_engine_gap): the learner's {family} model is not the engine's; fix the mapping, not the bound")
