"""GRPO, as pure functions: advantages, sampling-transform logprobs, the clipped policy loss with KL and IS.

What GRPO means here (one batch = several groups, one group = samples of one prompt):
- advantage A_i: group-relative, computed by the loop before the learner sees the batch (orchestration/update.py);
- per token: ratio = pi_theta / pi_old; pg = max(-A ratio, -A clip(ratio, 1 - eps_low, 1 + eps_high)); with
  dual-clip (Ye et al. 2020, off by default) pg = min(pg, -c A) for A < 0, c > 1, so a negative-advantage
  token whose ratio has grown large adds a bounded loss (and no gradient);
- on-policy (one update per batch) pi_old = pi_theta, so the ratio is exactly 1 and neither clip does anything:
  the only bound on the engine/learner drift is the IS cap below;
- the engine sampled from its own numerics, so each token's loss is weighted by the truncated IS ratio
  min(pi_old / pi_engine, cap) (detached), both under the *same* sampling transform (temperature, top-k,
  top-p, min-p): comparing a tempered, truncated engine distribution with a raw learner one is the usual bug;
- + beta * a KL estimator (k1/k2/k3, see `kl_penalty` for which gradient each gives);
- aggregation as per-token weights (`token_weights`) computed once per mini-batch, so gradient accumulation
  over micro-batches sums to exactly the mini-batch loss.
Metrics come back as masked *sums* so micro-batches add up; the learner divides by the token count.
Every per-token term (loss weights, ratio and IS metrics, entropy) is weighted by `loss_mask`, which is 0 at tokens
the model did not sample (prompt, padding, a multi-turn environment's replies: learner/batch.py), so those tokens
add nothing to the loss, the ratio or the metrics.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from learner.sampling import SamplingTransform

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps one wild token from producing inf/nan (Tunix clamps the same)


def _dense_keep_mask(scaled: jax.Array, s: SamplingTransform) -> jax.Array:
    """Tokens the engine could sample: min-p, then top-k, then top-p (vLLM's order), on tempered logits.

    The reference (a full-vocabulary sort for top-p); `logprobs.keep_mask` is the fast equivalent."""
    keep = jnp.ones(scaled.shape, bool)
    if s.min_p > 0.0:
        # p_j >= min_p * p_max  <=>  z_j >= z_max + log(min_p)
        keep &= scaled >= jnp.max(scaled, axis=-1, keepdims=True) + jnp.log(s.min_p)
    if s.top_k > 0 and s.top_k < scaled.shape[-1]:
        kth = jax.lax.top_k(jnp.where(keep, scaled, -jnp.inf), s.top_k)[0][..., -1:]
        keep &= scaled >= kth
    if s.top_p < 1.0:
        masked = jnp.where(keep, scaled, -jnp.inf)
        desc = -jnp.sort(-masked, axis=-1)
        probs = jax.nn.softmax(desc, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p: token i stays if the mass before it is < top_p.
        before = jnp.cumsum(probs, axis=-1) - probs
        n_keep = jnp.maximum(jnp.sum(before < s.top_p, axis=-1, keepdims=True), 1)
        threshold = jnp.take_along_axis(desc, n_keep - 1, axis=-1)
        keep &= scaled >= threshold
    return keep


def dense_sampling_logprobs(
    logits: jax.Array, targets: jax.Array, s: SamplingTransform, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[jax.Array, jax.Array | None]:
    """Log-prob of `targets` under the sampling distribution (tempered, truncated, renormalised); [B, L].

    The dense reference (`learner.logprob_chunk: 0`): full [B, L, V] fp32 arrays, no penalties or min_tokens.
    The learner's default path is `logprobs.window_logprobs`, equal to this within float rounding.

    The target itself is always kept in the support: a token the engine sampled but that falls just outside the
    learner's top-k/top-p set (numerics differ) gets a finite logprob instead of -inf.
    """
    scaled = logits.astype(jnp.float32) / s.temperature
    if s.truncates:
        keep = _dense_keep_mask(jax.lax.stop_gradient(scaled), s)
        keep |= jax.nn.one_hot(targets, scaled.shape[-1], dtype=bool)
        scaled = jnp.where(keep, scaled, -jnp.inf)
    lse = jax.nn.logsumexp(scaled, axis=-1)
    target_logit = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0]
    logp = target_logit - lse
    # Reuses lse (a fresh softmax would add two more passes over [B, L, V]).
    entropy = sampling_entropy(scaled, lse, entropy_grad) if with_entropy else None
    return logp, entropy


def sampling_entropy(scaled: jax.Array, lse: jax.Array, grad: bool) -> jax.Array:
    """Entropy of softmax(scaled) [..., V] -> [...], `lse` its log-normaliser; -inf logits (truncated) count 0.
    Detached unless `grad` (the entropy bonus, `entropy_coef`, differentiates it)."""
    log_p = scaled - lse[..., None]
    if not grad:
        log_p = jax.lax.stop_gradient(log_p)
    p = jnp.exp(log_p)
    # The inner where keeps 0 * -inf (a truncated token) out of the gradient as well as the value.
    return -jnp.sum(p * jnp.where(p > 0, log_p, 0.0), axis=-1)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: str) -> jax.Array:
    """Per-token KL estimate with d = log pi_theta(y) - log pi_ref(y), y ~ pi_theta (Schulman's k1, k2, k3).

    As *values* all three estimate KL(pi_theta || pi_ref). As a *loss term* (gradient through logp only, the
    samples held fixed, as here) they give different gradients; with E over y ~ pi_theta and
    g = grad log pi_theta(y) (derivation in tests/unit/test_loss.py, checked exactly on a small vocabulary):
    - k1 = d: grad = g, and E[g] = 0: zero-mean noise, no pull toward the reference at all;
    - k2 = d^2 / 2: grad = d g, and E[d g] = grad KL(pi_theta || pi_ref): the reverse KL the GRPO objective states
      (the default);
    - k3 = exp(-d) + d - 1: grad = (1 - pi_ref / pi_theta) g, and its mean is -E_ref[g] = grad KL(pi_ref || pi_theta):
      the *forward* KL (what DeepSeek's GRPO loss optimises in practice).
    """
    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff**2
    if estimator == "k3":
        d = jnp.clip(-diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return jnp.exp(d) - d - 1.0
    raise ValueError(f"kl_estimator {estimator!r}: use 'k1', 'k2' or 'k3'")


def token_weights(loss_mask: np.ndarray, mode: str, norm_tokens: int) -> np.ndarray:
    """Per-token weights w with loss = sum(w * per_token_loss); computed over a whole mini-batch [B, L]."""
    mask = np.asarray(loss_mask, np.float32)
    lengths = mask.sum(axis=-1, keepdims=True)
    n_seqs = max(int((lengths > 0).sum()), 1)
    if mode == "token-mean":
        return mask / max(float(mask.sum()), 1.0)
    if mode == "seq-mean-token-mean":
        return mask / np.maximum(lengths, 1.0) / n_seqs
    if mode == "seq-mean-token-sum-norm":
        return mask / float(norm_tokens) / n_seqs
    raise ValueError(f"loss_agg {mode!r}: use token-mean, seq-mean-token-mean or seq-mean-token-sum-norm")


class LossOptions(NamedTuple):
    """The GRPO knobs the loss reads (static under jit)."""

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    kl_beta: float = 0.0
    kl_estimator: str = "k2"
    is_cap: float | None = 2.0
    dual_clip: float | None = None  # c > 1: for A < 0 the per-token loss is at most -c A (None = off)
    entropy_coef: float = 0.0  # > 0: the loss subtracts entropy_coef x the sampling distribution's entropy

    @classmethod
    def of(cls, grpo) -> LossOptions:
        """The options a `GrpoConfig` (learner/config.py) sets."""
        return cls(grpo.clip_eps_low, grpo.clip_eps_high, grpo.kl_beta, grpo.kl_estimator, grpo.is_cap, grpo.dual_clip,
                   grpo.entropy_coef)


def grpo_token_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    old_cmp_logp: jax.Array,
    engine_logp: jax.Array,
    advantages: jax.Array,
    weights: jax.Array,
    loss_mask: jax.Array,
    opts: LossOptions,
    ref_logp: jax.Array | None = None,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO loss for one micro-batch ([B, L] per-token inputs, [B] advantages) and masked metric sums.

    `old_cmp_logp` is the pre-update learner logprob in the engine's convention (the same as `old_logp` when the
    engine reports processed logprobs; the raw one when it reports raw logprobs).
    """
    adv = advantages[:, None]
    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * jnp.clip(ratio, 1.0 - opts.clip_eps_low, 1.0 + opts.clip_eps_high)
    pg = jnp.maximum(pg1, pg2)
    dual = jnp.zeros_like(pg, bool)
    if opts.dual_clip is not None:
        dual = (adv < 0) & (pg > -opts.dual_clip * adv)
        pg = jnp.where(dual, -opts.dual_clip * adv, pg)

    # Truncated IS against the engine: old (pre-update learner) vs engine, both under the sampling transform.
    mismatch = jax.lax.stop_gradient(old_cmp_logp - engine_logp)
    is_ratio = jnp.exp(jnp.clip(mismatch, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    is_weight = is_ratio if opts.is_cap is None else jnp.minimum(is_ratio, opts.is_cap)
    per_token = is_weight * pg

    kl = jnp.zeros_like(logp)
    if opts.kl_beta > 0.0:
        if ref_logp is None:
            raise ValueError("kl_beta > 0 needs reference logprobs")
        kl = kl_penalty(logp, ref_logp, opts.kl_estimator)
        per_token = per_token + opts.kl_beta * kl
    if opts.entropy_coef > 0.0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropy, with its gradient")
        per_token = per_token - opts.entropy_coef * entropy
    loss = jnp.sum(weights * per_token)

    m = loss_mask
    # k3 estimate of KL(engine || learner) from engine samples: r - 1 - log r with r = pi_learner / pi_engine.
    mismatch_kl = is_ratio - 1.0 - jnp.clip(mismatch, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    sums = {
        "tokens": jnp.sum(m),
        "clip": jnp.sum(m * (pg2 > pg1)),
        "dual_clip": jnp.sum(m * dual),
        "kl": jnp.sum(m * jax.lax.stop_gradient(kl)),
        "is_ratio": jnp.sum(m * is_ratio),
        "is_clip": jnp.sum(m * (is_ratio > opts.is_cap)) if opts.is_cap is not None else jnp.zeros(()),
        "logprob_abs_diff": jnp.sum(m * jnp.abs(mismatch)),
        "mismatch_kl": jnp.sum(m * mismatch_kl),
    }
    return loss, sums
