"""orchestration/update.py: a step's scored samples as the learner's update plan, and its answers as one metrics row.

The calls themselves run against a real Learner in tests/integration/test_learner_step.py (their order, that
forward_backward applies nothing, the number of updates)."""

from __future__ import annotations

import numpy as np
import pytest

from learner.config import GrpoConfig
from orchestration.update import ScoredSamples, plan_update, update_metrics


def scored(rewards: list[float], group_size: int) -> ScoredSamples:
    n = len(rewards)
    return ScoredSamples([[1, 2]] * n, [[3 + i] for i in range(n)], [[-0.5]] * n, np.asarray(rewards, np.float32),
                         np.repeat(np.arange(n // group_size), group_size))


def test_the_plan_gives_each_sample_its_group_advantage_and_splits_mini_batches_in_order():
    plan = plan_update(GrpoConfig(mini_batch_size=4, epochs=2), scored([0, 1, 1, 0, 1, 1, 1, 1], 4))
    assert [len(m) for m in plan.minis] == [4, 4] and plan.epochs == 2 and not plan.on_policy
    first, second = plan.minis
    assert [c[0] for c in first.completion_ids + second.completion_ids] == list(range(3, 11)), "order kept"
    std = np.std([0, 1, 1, 0], ddof=1)
    np.testing.assert_allclose(first.advantages, np.array([-0.5, 0.5, 0.5, -0.5]) / (std + 1e-6), rtol=1e-6)
    np.testing.assert_array_equal(second.advantages, np.zeros(4))  # all equal: advantage 0
    assert plan.metrics["learner/zero_adv_frac"] == 0.5


def test_the_plan_leaves_out_constant_groups_only_when_asked_and_never_all_of_them():
    rewards = [0, 1, 0, 1, 1, 1, 1, 1]
    skipped = plan_update(GrpoConfig(skip_zero_variance_groups=True), scored(rewards, 4))
    assert [len(m) for m in skipped.minis] == [4] and skipped.on_policy
    assert plan_update(GrpoConfig(), scored(rewards, 4)).minis[0].advantages.shape == (8,)
    every = plan_update(GrpoConfig(skip_zero_variance_groups=True), scored([1.0] * 8, 4))
    assert len(every.minis[0]) == 8 and every.metrics["learner/zero_adv_frac"] == 1.0


def test_dr_grpo_advantages_are_only_centred():
    plan = plan_update(GrpoConfig(std_normalize=False), scored([0, 1, 3, 0], 4))
    np.testing.assert_allclose(plan.minis[0].advantages, [-1, 0, 2, -1])


def test_the_row_weights_each_pass_by_its_tokens_and_counts_the_samples_once():
    plan = plan_update(GrpoConfig(mini_batch_size=2, epochs=2), scored([0, 1, 0, 1], 2))
    passes = [{"learner/kl": kl, "learner/loss": loss, "learner/completion_tokens": tokens,
               "learner/trained_samples": 2.0} for kl, loss, tokens in ((1.0, 0.2, 10), (4.0, 0.4, 30))] * 2
    steps = [{"learner/grad_norm": g, "learner/step_s": 1.0, "learner/compile_s": 0.5} for g in (1, 2, 3, 4)]
    row = update_metrics(plan, list(zip(passes, steps)))
    assert row["learner/kl"] == pytest.approx((10 * 1.0 + 30 * 4.0) / 40)  # as one pass over all tokens
    assert row["learner/loss"] == pytest.approx(0.3) and row["learner/grad_norm"] == pytest.approx(2.5)
    assert (row["learner/completion_tokens"], row["learner/trained_samples"]) == (40.0, 4.0), "first epoch only"
    assert (row["learner/updates"], row["learner/step_s"], row["learner/compile_s"]) == (4.0, 4.0, 2.0)
    assert "learner/adv_std" in row and "learner/zero_adv_frac" in row


def test_one_pass_row_is_that_pass_unchanged():
    """On-policy (the demo's default) the row holds the learner's own figures bit for bit."""
    plan = plan_update(GrpoConfig(), scored([0, 1, 0, 1], 2))
    fb = {"learner/kl": 0.1234567, "learner/loss": 0.3, "learner/completion_tokens": 7.0,
          "learner/trained_samples": 4.0}
    row = update_metrics(plan, [(fb, {"learner/grad_norm": 0.7, "learner/step_s": 2.0, "learner/compile_s": 0.0})])
    assert row["learner/kl"] == 0.1234567 and row["learner/grad_norm"] == 0.7 and row["learner/updates"] == 1.0
