"""The reward set the loop calls once per step: built-in rewards in-process, the user's `fn` rewards in a pool.

Scoring never lets one bad sample take the step down silently or loudly by accident. A built-in reward that raises
(or returns a non-finite value) on a sample, or a user's reward call that fails in any way (rewards/pool.py: raises,
returns no list of numbers, times out, exits, runs out of memory) on a group, yields one logged line naming the
reward, the kind, the samples and the start of a completion; with `on_error="zero"` those samples score 0 for that
reward and the others keep their scores, with `on_error="fail"` the step raises RuntimeError with the same line.
Every failure is counted by kind (`RewardResult.failures`, logged as `reward/errors/<kind>`).

Built-in rewards stay a plain loop in the calling process: a few microseconds a sample, nothing to isolate (they
parse with bounded work, common/arithmetic.py). A user's function gets TRL's batch signature (rewards/user.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from itertools import accumulate
from dataclasses import dataclass, field

from rewards.catalog import build_reward
from rewards.config import RewardsConfig, RewardTerm
from rewards.pool import FAILURE_KINDS, Call, Outcome, RewardPool
from rewards.types import BatchRewardFn, RewardFn, Sample, TrainingProgress
from rewards.user import UserReward

log = logging.getLogger(__name__)

TASK_REWARDS = ("countdown", "math_answer")
"""Built-in rewards that define "solved" in evals when rewards.solved_by is not set."""


@dataclass
class RewardResult:
    """Scores of one batch of samples."""

    totals: list[float]
    """Weighted sum per sample (a reward's None is left out of it)."""
    per_name: dict[str, list[float]]
    """Unweighted value of each reward per sample (NaN where a user's reward returned None); log `means()`."""
    errors: list[str]
    """One line per failure: a built-in reward on one sample, or a user's reward call on one group."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time spent in each reward for this batch (user rewards share one figure: they run together)."""
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_KINDS, 0))
    """Failures by kind (rewards.pool.FAILURE_KINDS); they sum to len(errors)."""
    logged_means: dict[str, float] = field(default_factory=dict)
    """What user rewards logged through TRL's `log_metric`, as `<term>/<name>`: the mean over the batch's calls
    (several batches of a step: their mean; logged as `reward/<term>/<name>`)."""
    counters: dict[str, float] = field(default_factory=dict)
    """Additive counts a batched reward reports for this batch, under their own keys (the judge's `judge/requests`,
    `judge/seconds`...; several batches of a step: their sum)."""

    def means(self) -> dict[str, float]:
        """Mean of each reward over the samples it scored (a reward that scored none is left out)."""
        out = {}
        for name, values in self.per_name.items():
            scored = [v for v in values if not math.isnan(v)]
            if scored:
                out[name] = sum(scored) / len(scored)
        return out


def reward_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """A step's reward figures over its batches (one per dynamic-sampling draw): each reward's mean over the samples
    it scored, the logged means (averaged over batches) and counters (summed), and the failures by kind."""
    import numpy as np  # here, not at the top: `import rewards` stays free of numpy for any Ray worker

    per_name: dict[str, list[float]] = {}
    means: dict[str, list[float]] = {}
    counters: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    for result in results:
        for name, values in result.per_name.items():
            per_name.setdefault(name, []).extend(values)
        for key, value in result.logged_means.items():
            means.setdefault(key, []).append(value)
        for key, value in result.counters.items():
            counters.setdefault(key, []).append(value)
        for kind, count in result.failures.items():
            failures[kind] = failures.get(kind, 0) + count
    return {
        **{f"reward/{name}": float(np.nanmean(v)) for name, v in per_name.items() if not np.isnan(v).all()},
        **{f"reward/{key}": float(np.mean(v)) for key, v in means.items()},
        **{key: float(np.sum(v)) for key, v in counters.items()},
        "reward/errors": sum(len(r.errors) for r in results),
        **{f"reward/errors/{kind}": count for kind, count in failures.items()},
    }


class RewardSet:
    """Built reward functions with their weights, error policy and (for `fn` terms) the worker pool."""

    def __init__(self, fns: Sequence[RewardFn | UserReward], weights: Sequence[float], on_error: str = "zero",
                 pool: RewardPool | None = None, solved_by: str | None = None):
        if len(fns) != len(weights):
            raise ValueError(f"{len(fns)} rewards but {len(weights)} weights; give one weight per reward")
        if pool is None and any(isinstance(fn, UserReward) for fn in fns):
            raise ValueError("rewards by import path need a RewardPool; build the set with setup_rewards")
        self.fns, self.weights, self.on_error, self.pool = list(fns), list(weights), on_error, pool
        self.solved_by = solved_by or next((n for n in TASK_REWARDS if n in self.names), None)
        """The reward whose value >= 1.0 means solved (evals' accuracy); None: no such reward in this set."""

    @property
    def names(self) -> list[str]:
        return [fn.__name__ for fn in self.fns]

    def score(self, samples: Sequence[Sample], group_sizes: Sequence[int] | None = None,
              progress: TrainingProgress | None = None) -> RewardResult:
        """Every reward on every sample. A user's reward is called once per group (`group_sizes`: the sizes of
        consecutive groups, e.g. [n] * prompts; None: the whole batch is one call), as TRL calls it per batch."""
        result = RewardResult(totals=[0.0] * len(samples), per_name={}, errors=[])
        user = self._score_user(samples, group_sizes, progress, result) if self.pool is not None else {}
        for fn, weight in zip(self.fns, self.weights):
            if isinstance(fn, UserReward):
                values = user[fn.__name__]
            else:
                start = time.perf_counter()
                if isinstance(fn, BatchRewardFn):  # one call for the batch (the judge); per-sample errors as below
                    values = [self._checked(fn, lambda v=v: v, sample, index, result)
                              for index, (sample, v) in enumerate(zip(samples, fn.score_batch(samples), strict=True))]
                    result.counters.update(fn.take_metrics())
                else:
                    values = [self._checked(fn, lambda s=sample: fn(s), sample, index, result)
                              for index, sample in enumerate(samples)]
                result.seconds[fn.__name__] = time.perf_counter() - start
            result.per_name[fn.__name__] = values
            result.totals = [total if math.isnan(value) else total + weight * value
                             for total, value in zip(result.totals, values)]
        return result

    def _checked(self, fn: RewardFn, get: Callable[[], float | Exception], sample: Sample, index: int,
                 result: RewardResult) -> float:
        """`get()`'s value if it is a finite number; else one error line, then 0 or a failed step (on_error)."""
        kind = "raised"
        try:
            value = get()
            if isinstance(value, Exception):  # a batched reward's per-sample failure
                raise value
            value = float(value)
            if not math.isfinite(value):
                kind = "invalid"
                raise ValueError(f"returned {value}")
            return value
        except Exception as exc:  # noqa: BLE001 - any reward bug must be reported per sample, not kill the step
            line = f"reward {fn.__name__} raised {exc!r} on sample {index}: completion {sample.completion[:80]!r}"
            self._fail(line, kind, result, exc)
            return 0.0

    def _score_user(self, samples: Sequence[Sample], group_sizes: Sequence[int] | None,
                    progress: TrainingProgress | None, result: RewardResult) -> dict[str, list[float]]:
        """Every user reward's values (NaN for None), each group one call in the pool."""
        spans = _spans(len(samples), group_sizes)
        terms = [fn for fn in self.fns if isinstance(fn, UserReward)]
        calls = [Call(fn.key, fn.kwargs(samples[a:b], progress)) for fn in terms for a, b in spans]
        start = time.perf_counter()
        outcomes = iter(self.pool.run(calls)) if calls else iter(())
        seconds = time.perf_counter() - start
        values: dict[str, list[float]] = {}
        logged: dict[str, list[float]] = {}
        for fn in terms:
            result.seconds[fn.__name__] = seconds
            values[fn.__name__] = []
            for a, b in spans:
                outcome: Outcome = next(outcomes)
                if outcome.kind is not None:
                    line = (f"reward {fn.__name__} failed ({outcome.kind}) on samples {a}-{b - 1}: {outcome.message}; "
                            f"completion {samples[a].completion[:80]!r}")
                    self._fail(line, outcome.kind, result)
                    values[fn.__name__] += [0.0] * (b - a)
                    continue
                values[fn.__name__] += [math.nan if v is None else v for v in outcome.values or []]
                for name, value in outcome.metrics.items():
                    logged.setdefault(f"{fn.__name__}/{name}", []).append(value)
        result.logged_means.update({key: sum(v) / len(v) for key, v in logged.items()})
        return values

    def _fail(self, line: str, kind: str, result: RewardResult, cause: BaseException | None = None) -> None:
        if self.on_error == "fail":
            raise RuntimeError(line) from cause
        log.error("%s (scored 0; set rewards.on_error=fail to stop instead)", line)
        result.errors.append(line)
        result.failures[kind] += 1

    def close(self) -> None:
        """Stop the worker pool (idempotent); built-in rewards need nothing."""
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> RewardSet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        if self.pool is not None:
            raise TypeError("a RewardSet with `fn` rewards owns worker processes and cannot be pickled; call "
                            "setup_rewards where it is used")
        return self.__dict__


def _spans(count: int, group_sizes: Sequence[int] | None) -> list[tuple[int, int]]:
    if group_sizes is None:
        return [(0, count)] if count else []
    if sum(group_sizes) != count:
        raise ValueError(f"group sizes {list(group_sizes)[:8]} add up to {sum(group_sizes)}, not {count} samples")
    return [(end - size, end) for end, size in zip(accumulate(group_sizes), group_sizes) if size]


def setup_rewards(cfg: RewardsConfig) -> RewardSet:
    """Build every term of `cfg`, and start the worker pool when a term is a function by import path.

    Bad params -> ValueError naming the term and the field; a function that does not import -> RewardImportError
    (a ValueError) naming the term. Close the set (or use it as a context manager) to stop the pool.
    """
    fns: list[RewardFn | UserReward] = []
    paths, where = {}, {}
    for index, term in enumerate(cfg.terms):
        if term.fn is None:
            fns.append(build_reward(term.name or "", term.params, f"rewards.terms[{index}]"))
            continue
        fns.append(UserReward(term.label, index, term.params))
        paths[index], where[index] = term.fn, f"rewards.terms[{index}].fn {term.fn}"
    pool = None
    if paths:
        pool = RewardPool(paths, where, cfg.pool)
    return RewardSet(fns, [term.weight for term in cfg.terms], cfg.on_error, pool, cfg.solved_by)


def score_batch(samples: Sequence[Sample], terms: Sequence[RewardTerm], on_error: str = "zero") -> RewardResult:
    """One-off scoring without keeping a RewardSet (docs/CONTRACTS.md names this form)."""
    with setup_rewards(RewardsConfig(terms=list(terms), on_error=on_error)) as rewards:
        return rewards.score(samples)
