"""The Tinker API's built-in losses over per-token inputs, as pure functions (summed, not averaged).

`target_logprobs` (here `logp`) is the current model's log p(target_tokens[i] | input[:i+1]) under the raw model
distribution (no temperature or truncation), as the Tinker docs define it. Each datum's loss is the sum over its
positions and the batch's the sum over datums; the gradient is that sum's. With `lp` the sampler's logprobs and `A`
the per-token advantages (the tinker-cookbook's "Loss functions in Tinker" page):

    cross_entropy        -(logp * weights)
    importance_sampling  -(exp(logp - lp) * A)
    ppo                  -min(r * A, clip(r, low, high) * A),      r = exp(logp - lp)
    cispo                -(stop_gradient(clip(r, low, high)) * logp * A)   one-sided by default: low 0, high 4
    dro                  -(logp * A - beta / 2 * (logp - lp)^2)

GRPO's own objective (learner/loss.py) is the learner's "grpo" loss; it reads a group batch, not these inputs.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from learner.loss import LOG_RATIO_CLAMP

# loss -> the loss_fn_inputs it reads besides target_tokens
TOKEN_LOSSES: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
# loss -> the input whose zeros make a position's loss 0 whatever the model's logprob there (None: no such input;
# dro's penalty reads every position). A datum's positions before its gate's first non-zero value (a prompt) need
# their logprobs but no gradient, and datums that share them share their forward pass (learner/token_step.py).
GATE: dict[str, str | None] = {
    "cross_entropy": "weights",
    "importance_sampling": "advantages",
    "ppo": "advantages",
    "cispo": "advantages",
    "dro": None,
}
# loss -> its loss_fn_config keys and their defaults
LOSS_DEFAULTS: dict[str, dict[str, float]] = {
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    # tinker-cookbook's loss tutorial (tutorials/202_loss_functions.py): CISPO clips one side by default, the lower
    # bound off and the coefficient capped at 4 (MiniMax-M1, ScaleRL)
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.05},
}


# losses the SDK's LossFnType lists that are not computed here, and why
NOT_COMPUTED: dict[str, str] = {
    "gspo": "its defaults (clip thresholds, the sequence_ratio_mask default) are not in the SDK or tinker-cookbook "
            "source this server follows",
    "stable_reinforce": "its definition is not in the SDK or tinker-cookbook source this server follows",
}


def loss_config(name: str, given: Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    """`given` checked against the loss's keys and completed with its defaults (hashable: jit keys on it)."""
    if name in NOT_COMPUTED:
        raise ValueError(f"loss_fn {name!r} is not computed by this server ({NOT_COMPUTED[name]}); use one of "
                         f"{sorted(TOKEN_LOSSES)}, or forward_backward_custom")
    if name not in TOKEN_LOSSES:
        raise ValueError(f"loss_fn {name!r} is not one this server computes; use one of {sorted(TOKEN_LOSSES)} (or "
                         "forward_backward_custom, which the SDK runs on cross_entropy)")
    defaults = LOSS_DEFAULTS.get(name, {})
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        raise ValueError(f"loss_fn_config {unknown} is not a setting of {name!r} (its settings: {sorted(defaults)})")
    return tuple(sorted({**defaults, **{k: float(v) for k, v in (given or {}).items()}}.items()))


def token_loss(name: str, logp: jax.Array, inputs: Mapping[str, jax.Array], mask: jax.Array,
               config: Mapping[str, float]) -> jax.Array:
    """The summed loss of one micro-batch ([B, L] arrays; `mask` 1 at real positions)."""
    return jnp.sum(mask * per_token_loss(name, logp, inputs, config))


def token_loss_rows(name: str, logp: jax.Array, inputs: Mapping[str, jax.Array], mask: jax.Array,
                    config: Mapping[str, float]) -> jax.Array:
    """[B]: each datum's summed loss (a pass of several tenants reports each its own)."""
    return jnp.sum(mask * per_token_loss(name, logp, inputs, config), axis=-1)


def per_token_loss(name: str, logp: jax.Array, inputs: Mapping[str, jax.Array],
                   config: Mapping[str, float]) -> jax.Array:
    """[B, L]: the loss at every position (before the mask)."""
    if name == "cross_entropy":
        if logp.ndim == 3:  # [B, L, K] soft targets: each position's loss sums its K weighted logprobs
            return -jnp.sum(logp * inputs["weights"], axis=-1)
        return -logp * inputs["weights"]
    adv, lp = inputs["advantages"], inputs["logprobs"]
    log_ratio = jnp.clip(logp - lp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    if name == "importance_sampling":
        return -ratio * adv
    if name == "ppo":
        clipped = jnp.clip(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
        return -jnp.minimum(ratio * adv, clipped * adv)
    if name == "cispo":
        clipped = jnp.clip(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
        return -jax.lax.stop_gradient(clipped) * logp * adv
    if name == "dro":
        return -(logp * adv - 0.5 * config["beta"] * (logp - lp) ** 2)
    raise ValueError(f"unknown token loss {name!r}")
