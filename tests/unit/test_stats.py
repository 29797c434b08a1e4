"""Interval math of orchestration/report/stats.py against published values and defining properties (no scipy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestration.report import stats

# Wilson 95% intervals as tabulated elsewhere (statsmodels proportion_confint(method="wilson") gives the same).
WILSON_REFERENCE = {(0, 10): (0.0, 0.27753), (5, 10): (0.23659, 0.76341), (10, 10): (0.72247, 1.0),
                    (1, 10): (0.01788, 0.40415)}


@pytest.mark.parametrize(("successes", "n"), list(WILSON_REFERENCE))
def test_wilson_matches_published_values(successes, n):
    iv = stats.wilson(successes, n)
    low, high = WILSON_REFERENCE[(successes, n)]
    assert iv.low == pytest.approx(low, abs=1e-5) and iv.high == pytest.approx(high, abs=1e-5), (
        f"wilson({successes}, {n}) = {iv}, published [{low}, {high}]: the score-interval formula is wrong")
    assert iv.value == successes / n
    assert (iv.low == 0.0) == (successes == 0) and (iv.high == 1.0) == (successes == n), "the ends must be exact"


@pytest.mark.parametrize(("successes", "n"), [(0, 10), (3, 10), (7, 50), (200, 200)])
def test_wilson_endpoints_solve_the_score_equation(successes, n):
    """Wilson's interval is {p : (phat - p)^2 <= z^2 p (1 - p) / n}; interior endpoints meet it with equality."""
    iv, phat, z = stats.wilson(successes, n), successes / n, stats.Z95
    for p in (iv.low, iv.high):
        if 0.0 < p < 1.0:
            assert (phat - p) ** 2 == pytest.approx(z * z * p * (1 - p) / n, rel=1e-9)


def test_wilson_covers_about_95_percent():
    """Measured coverage over 4000 seeded binomial draws at p = 0.1, n = 40 (Wald covers ~88% there)."""
    rng = np.random.default_rng(0)
    hits = [iv.low <= 0.1 <= iv.high for iv in (stats.wilson(int(x), 40) for x in rng.binomial(40, 0.1, 4000))]
    coverage = float(np.mean(hits))
    assert 0.92 <= coverage <= 0.98, f"Wilson coverage {coverage:.3f} at p=0.1, n=40; expected ~0.95"


@pytest.mark.parametrize(("successes", "n"), [(-1, 10), (11, 10), (0, 0)])
def test_wilson_rejects_impossible_counts(successes, n):
    with pytest.raises(ValueError, match="successes"):
        stats.wilson(successes, n)


def test_bootstrap_of_constant_differences_is_that_constant():
    iv = stats.bootstrap_mean(np.full(50, 0.25))
    assert (iv.value, iv.low, iv.high) == (0.25, 0.25, 0.25)


def test_bootstrap_agrees_with_the_normal_interval_on_many_prompts():
    """For 400 prompts the percentile bootstrap of a mean is close to mean +- 1.96 sd / sqrt(n)."""
    d = np.random.default_rng(1).choice([-1.0, 0.0, 0.0, 1.0, 1.0], size=400)
    iv = stats.bootstrap_mean(d)
    half = stats.Z95 * d.std(ddof=1) / math.sqrt(d.size)
    assert iv.low == pytest.approx(d.mean() - half, abs=0.01) and iv.high == pytest.approx(d.mean() + half, abs=0.01)


def test_bootstrap_is_reproducible_and_seeded():
    d = np.random.default_rng(2).normal(size=60)
    assert stats.bootstrap_mean(d) == stats.bootstrap_mean(d)
    assert stats.bootstrap_mean(d, seed=1) != stats.bootstrap_mean(d, seed=2)


def test_paired_difference_uses_the_pairing():
    """Trained solves exactly the prompts base solves plus 10 more: every per-prompt difference is 0 or +1, so the
    paired interval excludes 0 although the two accuracies' own intervals overlap."""
    base = np.zeros((100, 1), bool)
    base[:30] = True
    trained = base.copy()
    trained[30:40] = True
    per = [stats.per_prompt_metrics(s, s.astype(float)) for s in (base, trained)]
    diff = stats.paired_differences(*per)["accuracy"]
    assert diff.value == pytest.approx(0.1) and diff.low > 0.03, diff
    solo = [stats.solved_intervals(s)["accuracy"] for s in (base, trained)]
    assert solo[0].high > solo[1].low, "vacuity check: the unpaired intervals should overlap here"


def test_solved_intervals_count_samples_and_prompts():
    solved = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    out = stats.solved_intervals(solved)
    assert (out["accuracy"].value, out["accuracy"].n) == (5 / 12, 12)
    assert (out["pass@4"].value, out["pass@4"].n) == (2 / 3, 3)


def test_paired_differences_reject_different_prompt_sets():
    with pytest.raises(ValueError, match="same prompts"):
        stats.paired_differences({"accuracy": np.zeros(3)}, {"accuracy": np.zeros(4)})
