"""GRPO steps (orchestration/update.py over the Learner's primitives) on the tiny model, on a device slice that is
not device 0, with on-policy samples.

The "engine" here is the learner's own model sampled in the test with temperature and top-k (`sample`), so the
engine logprobs are exact: the learner must reproduce them under the same sampling transform (mismatch ~ 0).
The toy reward is the fraction of odd token ids; its expectation under the policy is measured on fixed
contexts (deterministic), and a few GRPO steps must raise it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from orchestration.update import ScoredSamples, grpo_step, plan_update
from learner.config import LearnerConfig
from learner.learner import Learner
from learner.sampling import SamplingTransform

pytestmark = pytest.mark.integration
T, K, P, N, G = 5.0, 50, 8, 8, 8  # temperature, top_k, prompt / completion tokens, group size
METRICS = ["loss", "grad_norm", "kl", "clip_frac", "is_ratio_mean", "is_clip_frac", "logprob_abs_diff",
           "mismatch_kl", "adv_std", "entropy"]


def log_transform(logits: np.ndarray) -> np.ndarray:
    """Log-probs after temperature and top-k, renormalised (what the engine samples from)."""
    z = logits.astype(np.float64) / T
    z = np.where(z >= np.sort(z, -1)[..., -K][..., None], z, -np.inf)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def sample(learner: Learner, prompts: np.ndarray, rng: np.random.Generator):
    """Sample N tokens per prompt from the learner's policy; returns (tokens [B, P + N], logprobs [B, N])."""
    toks = np.zeros((len(prompts), P + N), np.int32)
    toks[:, :P] = prompts
    lps = np.zeros((len(prompts), N))
    for t in range(N):
        p = np.exp(log_transform(learner.logits(toks)[:, P + t - 1]))
        for b in range(len(prompts)):
            toks[b, P + t] = rng.choice(p.shape[-1], p=p[b] / p[b].sum())
            lps[b, t] = np.log(p[b, toks[b, P + t]])
    return toks, lps


def odd_mass(learner: Learner, toks: np.ndarray) -> float:
    """Expected toy reward on fixed contexts: probability mass on odd ids at each completion position."""
    return float(np.exp(log_transform(learner.logits(toks)[:, P - 1 : P + N - 1]))[..., 1::2].sum(-1).mean())


def batch_from(toks: np.ndarray, lps: np.ndarray) -> ScoredSamples:
    comp = toks[:, P:]
    return ScoredSamples([list(p) for p in toks[:, :P]], [list(c) for c in comp], [list(x) for x in lps],
                         rewards=(comp % 2 == 1).mean(1), group_ids=np.repeat(np.arange(len(toks) // G), G),
                         sampling=SamplingTransform(temperature=T, top_k=K))


def flat(tree) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(tree)]


def test_steps_move_lora_keep_base_and_raise_toy_reward(tiny_model_dir):
    cfg = LearnerConfig.model_validate({
        "devices": {"offset": 2, "count": 2}, "optimizer": {"lr": 5e-3}, "seq_bucket": 16,
        "grpo": {"micro_batch_size": 8},
    })
    learner = Learner(cfg, tiny_model_dir)
    used = {d.id for leaf in jax.tree.leaves(learner.params) for d in leaf.devices()}
    assert used <= {2, 3}, f"LoRA params on devices {used}: the learner must stay on its slice [2, 3]"
    base0, lora0 = flat(learner.base_state), flat(learner.params)

    rng = np.random.default_rng(0)
    prompts = rng.integers(3, 49000, (2, P)).repeat(G, 0)
    eval_toks, _ = sample(learner, prompts, rng)
    start = odd_mass(learner, eval_toks)
    for _ in range(4):
        metrics = grpo_step(learner, learner.cfg.grpo, batch_from(*sample(learner, prompts, rng)))
        for key in METRICS:
            assert np.isfinite(metrics[f"learner/{key}"]), f"learner/{key} is not finite: {metrics}"
        assert metrics["learner/logprob_abs_diff"] < 1e-4, (
            f"learner vs engine logprob diff {metrics['learner/logprob_abs_diff']:.2e} with identical numerics: "
            "the learner is not applying the engine's temperature/top-k transform")
    end = odd_mass(learner, eval_toks)

    assert any(not np.array_equal(a, b) for a, b in zip(lora0, flat(learner.params))), (
        "LoRA params unchanged after step: gradients not flowing to LoRAParam")
    for a, b in zip(base0, flat(learner.base_state)):
        np.testing.assert_array_equal(a, b, err_msg="a base weight changed: the optimizer must touch LoRA only")
    assert end > start + 0.01, f"toy reward did not rise: expected odd mass {start:.4f} -> {end:.4f}"


def test_multi_update_kl_and_is_metrics(tiny_model_dir):
    """epochs=2 x 2 mini-batches = 4 updates per batch, KL to the reference, engine logprobs perturbed."""
    cfg = LearnerConfig.model_validate({
        "devices": {"offset": 1, "count": 2}, "optimizer": {"lr": 1e-2}, "seq_bucket": 16,
        "grpo": {"epochs": 2, "mini_batch_size": 8, "micro_batch_size": 4, "kl_beta": 0.05, "is_cap": 1.5,
                 "loss_agg": "seq-mean-token-sum-norm", "norm_tokens": N},
    })
    learner = Learner(cfg, tiny_model_dir)
    rng = np.random.default_rng(1)
    toks, lps = sample(learner, rng.integers(3, 49000, (2, P)).repeat(G, 0), rng)
    noisy = lps + rng.normal(0, 0.5, lps.shape)  # an engine with other numerics
    metrics = grpo_step(learner, learner.cfg.grpo, batch_from(toks, noisy))
    assert metrics["learner/updates"] == 4
    assert metrics["learner/kl"] > 0, "KL to the reference stays 0 after 4 updates: reference forward broken"
    assert 0.2 < metrics["learner/logprob_abs_diff"] < 0.6, metrics
    assert 0 < metrics["learner/is_clip_frac"] < 1 and metrics["learner/mismatch_kl"] > 0


def test_grpo_forward_backward_accumulates_and_only_optim_step_applies(tiny_model_dir):
    """The handle's contract holds for GRPO as for the token losses: forward_backward adds its gradient to the held
    one and changes no weight (not even with epochs and mini-batches configured: the loop makes those updates),
    two calls hold the sum of their gradients, and optim_step applies it. Fails on main at 50ebc49, where
    forward_backward(batch, "grpo") applied every update but the last itself."""
    cfg = LearnerConfig.model_validate({
        "devices": {"offset": 1, "count": 1}, "optimizer": {"lr": 1e-2}, "seq_bucket": 16,
        "grpo": {"epochs": 2, "mini_batch_size": 8, "micro_batch_size": 4}})
    learner = Learner(cfg, tiny_model_dir)
    policy = learner.adapters["policy"]
    rng = np.random.default_rng(4)
    toks, lps = sample(learner, rng.integers(3, 49000, (2, P)).repeat(G, 0), rng)
    plan = plan_update(cfg.grpo, batch_from(toks, lps))
    assert len(plan.minis) == 2 and plan.epochs == 2
    start = flat(learner.params)

    def gradient(*minis) -> list[np.ndarray]:
        for mini in minis:
            learner.forward_backward(mini, "grpo")
        for a, b in zip(start, flat(learner.params)):
            np.testing.assert_array_equal(a, b, err_msg="forward_backward changed a weight")
        grads, policy.grads, policy.open = flat(policy.grads), None, None
        return grads

    first, second, both = gradient(plan.minis[0]), gradient(plan.minis[1]), gradient(*plan.minis)
    assert max(float(np.abs(g).max()) for g in first) > 0, "vacuous: no gradient"
    for a, b, ab in zip(first, second, both):
        np.testing.assert_allclose(ab, a + b, rtol=1e-5, atol=1e-7, err_msg="two calls do not hold the sum")
    learner.forward_backward(plan.minis[0], "grpo")
    learner.optim_step()
    assert any(not np.array_equal(a, b) for a, b in zip(start, flat(learner.params))), "optim_step applied nothing"
    assert policy.grads is None


def test_chunked_logprobs_step_equals_the_dense_reference(tiny_model_dir):
    """learner.logprob_chunk (completion positions only, chunked) vs 0 (dense [B, L, V]): same loss, gradient
    norm and metrics within 1e-6, with two updates (old logprobs), KL and the entropy bonus (its gradient fused in
    the chunked path, autodiff in the dense one), so every logprob pass is compared.
    lr is tiny: Adam turns float-rounding-level gradient differences into lr-sized steps, which the second
    update would then compare instead of the logprobs."""
    sampling = SamplingTransform(temperature=0.9, top_p=0.9, min_p=0.01)  # top-p by bisection
    def run(chunk: int):
        cfg = LearnerConfig.model_validate({
            "devices": {"offset": 1, "count": 1}, "seq_bucket": 16, "logprob_chunk": chunk, "optimizer": {"lr": 1e-9},
            "grpo": {"mini_batch_size": 8, "micro_batch_size": 4, "kl_beta": 0.05, "entropy_coef": 0.01}})
        learner = Learner(cfg, tiny_model_dir)
        rng = np.random.default_rng(2)
        toks, lps = sample(learner, rng.integers(3, 49000, (2, P)).repeat(G, 0), rng)
        batch = batch_from(toks, lps + rng.normal(0, 0.3, lps.shape))
        batch = ScoredSamples(batch.prompt_ids, batch.completion_ids, batch.engine_logprobs, batch.rewards,
                              batch.group_ids, sampling)
        return grpo_step(learner, learner.cfg.grpo, batch)

    dense, chunked = run(0), run(3)
    for key in METRICS:
        np.testing.assert_allclose(chunked[f"learner/{key}"], dense[f"learner/{key}"], atol=1e-6, err_msg=key)


def test_skipping_constant_reward_groups_equals_training_on_the_varying_groups_alone(tiny_model_dir):
    """grpo.skip_zero_variance_groups: a batch of one group with varied rewards and one all-equal group updates the
    LoRA exactly as the varied group alone does; without the skip the all-equal group still costs a pass and
    dilutes the token-mean loss (half the gradient). zero_adv_frac is logged either way."""
    def learner(skip: bool) -> Learner:
        return Learner(LearnerConfig.model_validate({
            "devices": {"offset": 0, "count": 1}, "seq_bucket": 16, "optimizer": {"lr": 1e-2},
            "grpo": {"micro_batch_size": G, "skip_zero_variance_groups": skip}}), tiny_model_dir)

    skip, keep, alone = learner(True), learner(False), learner(True)
    rng = np.random.default_rng(3)
    toks, lps = sample(skip, rng.integers(3, 49000, (2, P)).repeat(G, 0), rng)
    both = batch_from(toks, lps)
    rewards = np.concatenate([np.linspace(0, 1, G), np.full(G, 0.5)])  # group 0 varies, group 1 is constant
    both = ScoredSamples(both.prompt_ids, both.completion_ids, both.engine_logprobs, rewards, both.group_ids,
                         both.sampling)
    first = ScoredSamples(both.prompt_ids[:G], both.completion_ids[:G], both.engine_logprobs[:G], rewards[:G],
                          both.group_ids[:G], both.sampling)

    skipped, kept = grpo_step(skip, skip.cfg.grpo, both), grpo_step(keep, keep.cfg.grpo, both)
    only = grpo_step(alone, alone.cfg.grpo, first)
    assert skipped["learner/zero_adv_frac"] == kept["learner/zero_adv_frac"] == 0.5
    assert only["learner/zero_adv_frac"] == 0.0
    assert (skipped["learner/trained_samples"], kept["learner/trained_samples"]) == (G, 2 * G)
    for a, b in zip(flat(skip.params), flat(alone.params)):
        np.testing.assert_allclose(a, b, atol=1e-6, err_msg="skipping a constant group is not training without it")
    np.testing.assert_allclose(skipped["learner/grad_norm"], only["learner/grad_norm"], rtol=1e-5)
    # Kept, the constant group adds no gradient but half the tokens of the token-mean: the gradient halves.
    np.testing.assert_allclose(kept["learner/grad_norm"], only["learner/grad_norm"] / 2, rtol=1e-4)
    assert kept["learner/completion_tokens"] == 2 * skipped["learner/completion_tokens"]
