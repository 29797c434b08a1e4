"""Confidence intervals for eval results: Wilson for proportions, a paired bootstrap over prompts for differences.

Why these two:
- Accuracy and pass@k are proportions, often near 0 or 1 on small models, where the normal (Wald) interval
  collapses to zero width or leaves [0, 1]. Wilson's score interval stays inside [0, 1] and keeps close to its
  nominal coverage down to a handful of samples (Brown, Cai & DasGupta 2001).
- Base and trained are scored on the *same* prompts, and the k samples of one prompt are not independent (a prompt
  is easy or hard for both policies). Resampling whole prompts and taking the mean per-prompt difference respects
  both the pairing and the clustering; a two-proportion interval over samples would treat all 2 x prompts x k
  samples as independent and come out too narrow when k > 1 (and too wide when base and trained agree prompt by
  prompt). The RNG is seeded, so the same eval gives the same interval.

NumPy only, no scipy: the driver env imports this cheaply.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

Z95 = 1.959963984540054
"""Two-sided 95% standard normal quantile."""
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval and how it was computed."""

    value: float
    low: float
    high: float
    n: int
    """Trials (Wilson) or prompts (bootstrap) the estimate is over."""
    method: str

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def wilson(successes: int, n: int, z: float = Z95) -> Interval:
    """Wilson score interval for `successes` out of `n` independent trials."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 <= successes <= n and n >= 1, got {successes}/{n}")
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # The ends are exact (0/n: center == half, n/n: center + half == 1) but float rounding leaves ~1e-17.
    low = 0.0 if successes == 0 else center - half
    high = 1.0 if successes == n else center + half
    return Interval(p, low, high, n, "wilson")


def bootstrap_mean(per_prompt: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                   level: float = 0.95) -> Interval:
    """Percentile bootstrap interval of the mean of per-prompt values, resampling prompts with replacement.

    For a paired difference pass `trained_per_prompt - base_per_prompt` (same prompts, same order).
    """
    values = np.asarray(per_prompt, dtype=np.float64)
    if values.ndim != 1 or values.size < 1:
        raise ValueError(f"bootstrap_mean needs a 1-D array of per-prompt values, got shape {values.shape}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    # Chunks bound memory (resamples x prompts indices) for large eval sets.
    for start in range(0, resamples, 1000):
        count = min(1000, resamples - start)
        means[start : start + count] = values[rng.integers(0, values.size, (count, values.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(values.mean()), float(low), float(high), int(values.size),
                    f"paired bootstrap over prompts ({resamples} resamples, seed {seed})")


def solved_intervals(solved: np.ndarray) -> dict[str, Interval]:
    """Wilson intervals for accuracy (over all samples) and pass@k (over prompts) of a [prompts, k] bool array.

    The accuracy interval treats the k samples of a prompt as independent, so for k > 1 it is somewhat too narrow;
    the base-vs-trained difference (`paired_differences`) does not make that assumption.
    """
    solved = np.asarray(solved, dtype=bool)
    if solved.ndim != 2 or solved.size == 0:
        raise ValueError(f"solved must be a non-empty [prompts, k] array, got shape {solved.shape}")
    k = solved.shape[1]
    return {"accuracy": wilson(int(solved.sum()), solved.size),
            f"pass@{k}": wilson(int(solved.any(axis=1).sum()), solved.shape[0])}


def per_prompt_metrics(solved: np.ndarray, totals: np.ndarray) -> dict[str, np.ndarray]:
    """Each metric's value per prompt (accuracy, pass@k, reward_mean): what the paired bootstrap resamples."""
    solved = np.asarray(solved, dtype=bool)
    return {"accuracy": solved.mean(axis=1), f"pass@{solved.shape[1]}": solved.any(axis=1).astype(np.float64),
            "reward_mean": np.asarray(totals, dtype=np.float64).mean(axis=1)}


def paired_differences(base: dict[str, np.ndarray], trained: dict[str, np.ndarray],
                       seed: int = BOOTSTRAP_SEED) -> dict[str, Interval]:
    """trained - base for every per-prompt metric both have, each with a paired bootstrap interval."""
    out = {}
    for key in base.keys() & trained.keys():
        if base[key].shape != trained[key].shape:
            raise ValueError(f"{key}: base has {base[key].shape} prompts, trained {trained[key].shape}; "
                             "evaluate both on the same prompts")
        out[key] = bootstrap_mean(trained[key] - base[key], seed=seed)
    return dict(sorted(out.items()))
