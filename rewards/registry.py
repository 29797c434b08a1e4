"""Reward registry and the weighted combination the loop calls once per step.

Scoring never lets one bad sample take the step down silently or loudly by accident: a reward that raises (or
returns a non-finite value) yields one logged line naming the reward, the sample index and the start of the
completion; with `on_error="zero"` that sample scores 0 for that reward and the other samples keep their scores,
with `on_error="fail"` the step raises RuntimeError with the same line.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rewards.catalog import build_reward
from rewards.config import RewardsConfig, RewardTerm
from rewards.types import BatchRewardFn, RewardFn, Sample

log = logging.getLogger(__name__)

@dataclass
class RewardResult:
    """Scores of one batch of samples."""

    totals: list[float]
    """Weighted sum per sample."""
    per_name: dict[str, list[float]]
    """Unweighted value of each reward per sample (log as `reward/<name>`)."""
    errors: list[str]
    """One line per (reward, sample) that raised."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time spent in each reward for this batch (log as `timing/reward_<name>` if wanted)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Additive counters a batched reward reports for this batch (the judge's `judge/requests`, `judge/seconds`...)."""


class RewardSet:
    """Built reward functions with their weights and error policy."""

    def __init__(self, fns: Sequence[RewardFn], weights: Sequence[float], on_error: str = "zero"):
        if len(fns) != len(weights):
            raise ValueError(f"{len(fns)} rewards but {len(weights)} weights; give one weight per reward")
        self.fns, self.weights, self.on_error = list(fns), list(weights), on_error

    @property
    def names(self) -> list[str]:
        return [fn.__name__ for fn in self.fns]

    def score(self, samples: Sequence[Sample]) -> RewardResult:
        """Every reward on every sample; see the module docstring for what happens when one raises."""
        result = RewardResult(totals=[0.0] * len(samples), per_name={}, errors=[])
        for fn, weight in zip(self.fns, self.weights):
            start = time.perf_counter()
            if isinstance(fn, BatchRewardFn):  # one call for the batch (the judge); per-sample errors as below
                values = [self._checked(fn, lambda v=v: v, sample, index, result.errors)
                          for index, (sample, v) in enumerate(zip(samples, fn.score_batch(samples), strict=True))]
                result.metrics.update(fn.take_metrics())
            else:
                values = [self._checked(fn, lambda s=sample: fn(s), sample, index, result.errors)
                          for index, sample in enumerate(samples)]
            result.seconds[fn.__name__] = time.perf_counter() - start
            result.per_name[fn.__name__] = values
            result.totals = [total + weight * value for total, value in zip(result.totals, values)]
        return result

    def _checked(self, fn: RewardFn, get: Callable[[], float | Exception], sample: Sample, index: int,
                 errors: list[str]) -> float:
        """`get()`'s value if it is a finite number; else one error line, then 0 or a failed step (on_error)."""
        try:
            value = get()
            if isinstance(value, Exception):  # a batched reward's per-sample failure
                raise value
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
            return value
        except Exception as exc:  # noqa: BLE001 - any reward bug must be reported per sample, not kill the step
            line = f"reward {fn.__name__} raised {exc!r} on sample {index}: completion {sample.completion[:80]!r}"
            if self.on_error == "fail":
                raise RuntimeError(line) from exc
            log.error("%s (scored 0; set rewards.on_error=fail to stop instead)", line)
            errors.append(line)
            return 0.0


def setup_rewards(cfg: RewardsConfig) -> RewardSet:
    """Build every term of `cfg`; bad params -> ValueError naming the term and the field."""
    fns = [build_reward(term.name, term.params, f"rewards.terms[{index}]") for index, term in enumerate(cfg.terms)]
    return RewardSet(fns, [term.weight for term in cfg.terms], cfg.on_error)


def score_batch(samples: Sequence[Sample], terms: Sequence[RewardTerm], on_error: str = "zero") -> RewardResult:
    """One-off scoring without keeping a RewardSet (docs/CONTRACTS.md names this form)."""
    return setup_rewards(RewardsConfig(terms=list(terms), on_error=on_error)).score(samples)
