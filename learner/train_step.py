"""The jitted pieces of a GRPO update: forward logprobs, one micro-batch's gradient (accumulated), the update.

The model is split once into (graphdef, LoRA params, base state); the LoRA params travel as a plain nested
dict (what optax and Orbax see) and are merged back into the graph inside each jitted function. Only the LoRA
dict is differentiated, so the base weights cannot change. Options that change the computation (sampling
transform, loss options, whether old/ref logprobs are given) are static: a run compiles once per length bucket.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec
from flax import nnx

from learner.config import OptimizerConfig
from learner.logprobs import window_logprobs
from learner.loss import LossOptions, dense_sampling_logprobs, grpo_token_loss
from learner.model import forward_hidden, forward_logits, hidden_out
from learner.sampling import SamplingTransform
from learner.shared_prompts import SharedPrompts, window_hidden
from learner.token_logprobs import token_logprobs
from learner.lora_rows import rows_use
from learner.token_losses import token_loss, token_loss_rows

__all__ = ["ModelParts", "MicroBatch", "TokenMicroBatch", "merge", "forward_logits", "make_logprob_fn",
           "make_accumulate_fn", "make_token_fn", "make_tenant_fn", "make_optimizer", "make_adam_optimizer", "with_adam",
           "make_apply_fn", "learning_rate"]


class MicroBatch(NamedTuple):
    """Device arrays of one micro-batch ([B, L] unless noted)."""

    tokens: jax.Array
    targets: jax.Array
    valid: jax.Array
    loss_mask: jax.Array
    engine_logprobs: jax.Array
    advantages: jax.Array  # [B]
    weights: jax.Array  # aggregation weights (see loss.token_weights)
    window: jax.Array  # int32 [B, W]: the position predicting each completion token (see batch.PackedBatch)
    shared: SharedPrompts | None = None  # the same rows as distinct prompts + completions (learner.share_prompts)


class TokenMicroBatch(NamedTuple):
    """Device arrays of one micro-batch of a TokenBatch ([B, L]; learner/token_batch.py PackedTokens): the model
    inputs, the token losses' inputs by name, and each datum's split into a prefix and a window
    (learner/token_logprobs.py)."""

    tokens: jax.Array
    targets: jax.Array
    valid: jax.Array
    loss_mask: jax.Array
    window: jax.Array
    inputs: dict[str, jax.Array]
    active_mask: jax.Array
    prefix_mask: jax.Array
    prefix_window: jax.Array | None = None
    shared: SharedPrompts | None = None  # the same rows as distinct prefixes + windows


class ModelParts(NamedTuple):
    """The split model: static graph, the shape template of the LoRA state, the frozen base state, and the
    config.json facts prompt sharing needs to size its KV cache."""

    graphdef: Any
    lora_template: Any
    base: Any
    hf: Any = None


def merge(parts: ModelParts, lora: dict) -> nnx.Module:
    state = jax.tree.map(lambda x: x, parts.lora_template)
    state.replace_by_pure_dict(lora)
    # Fresh Variables at the current trace level: nnx.remat (learner.remat) writes the block's state back into
    # the module after the checkpointed call, and Flax refuses to mutate Variables made by an outer trace (jit).
    return nnx.merge(parts.graphdef, state, jax.tree.map(lambda x: x, parts.base))


def zero_b(lora: dict) -> dict:
    """The same LoRA with every B zeroed: the base model (the KL reference) without a second copy of weights."""
    return {k: zero_b(v) if isinstance(v, dict) else (jnp.zeros_like(v) if k.endswith("lora_b") else v)
            for k, v in lora.items()}


def _logprobs(parts, lora, base, mb: MicroBatch, s: SamplingTransform, with_entropy: bool, raw: bool, chunk: int,
              fused_grad: bool = False, entropy_grad: bool = False):
    """(logp under the transform, entropy or None, raw logp or None), [B, L] each.

    chunk > 0: LM head and transform at completion positions only, `chunk` positions at a time (bounded
    memory; `fused_grad`: d logp / d hidden taken in the forward pass, for the loss), the decoder run once per
    distinct prompt where `mb.shared` is given; chunk = 0: the dense reference over full [B, L, V] logits (no
    penalties or min_tokens).
    """
    model = merge(parts._replace(base=base), lora)
    if chunk > 0:
        if mb.shared is not None:
            head = hidden_out(model)
            hidden = window_hidden(model, mb.shared, parts.hf, mb.window.shape[1])
        else:
            hidden, head = forward_hidden(model, mb.tokens, mb.valid)
        vocab = jax.eval_shape(head, jax.ShapeDtypeStruct((1, hidden.shape[-1]), hidden.dtype)).shape[-1]
        return window_logprobs(hidden, head, vocab, mb, s, chunk, with_entropy, raw, fused_grad,
                               at_window=mb.shared is not None, entropy_grad=entropy_grad)
    if s.needs_history:
        raise ValueError(f"learner.logprob_chunk=0 (dense reference) does not model penalties or min_tokens ({s}); "
                         "set learner.logprob_chunk > 0")
    logits = forward_logits(model, mb.tokens, mb.valid)
    logp, entropy = dense_sampling_logprobs(logits, mb.targets, s, with_entropy, entropy_grad)
    raw_logp = dense_sampling_logprobs(logits, mb.targets, SamplingTransform())[0] if raw else None
    return logp, entropy, raw_logp


def make_logprob_fn(parts: ModelParts, sampling: SamplingTransform, raw: bool, chunk: int):
    """jit: (lora, base, mb) -> (logp under the sampling transform, raw logp or None); no gradient."""

    def fn(lora, base, mb):
        logp, _, raw_logp = _logprobs(parts, lora, base, mb, sampling, False, raw, chunk)
        return logp, raw_logp

    return jax.jit(fn)


def make_accumulate_fn(parts: ModelParts, sampling: SamplingTransform, opts: LossOptions, raw: bool,
                       off_policy: bool, chunk: int):
    """jit: (lora, base, grad_acc, mb, old_logp, old_cmp) -> (grad_acc + grad, loss, metric sums).

    on-policy (one update per batch): old logprobs = the current ones, detached; no extra forward.
    `raw`: the engine reported untransformed logprobs, so the IS/mismatch side compares raw ones.
    """

    def loss_fn(lora, base, mb, old_logp, old_cmp):
        logp, entropy, raw_logp = _logprobs(parts, lora, base, mb, sampling, True, raw, chunk, fused_grad=True,
                                            entropy_grad=opts.entropy_coef > 0.0)
        if not off_policy:
            old_logp = jax.lax.stop_gradient(logp)
            old_cmp = jax.lax.stop_gradient(raw_logp if raw else logp)
        ref_logp = None
        if opts.kl_beta > 0.0:
            ref_logp, _, _ = _logprobs(parts, zero_b(lora), base, mb, sampling, False, False, chunk)
            ref_logp = jax.lax.stop_gradient(ref_logp)
        loss, sums = grpo_token_loss(logp, old_logp, old_cmp, mb.engine_logprobs, mb.advantages, mb.weights,
                                     mb.loss_mask, opts, ref_logp, entropy)
        sums["entropy"] = jnp.sum(mb.loss_mask * jax.lax.stop_gradient(entropy))
        return loss, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def fn(lora, base, acc, mb, old_logp, old_cmp):
        (loss, sums), grads = grad_fn(lora, base, mb, old_logp, old_cmp)
        return jax.tree.map(jnp.add, acc, grads), loss, sums

    return jax.jit(fn, donate_argnums=(2,))


def make_token_fn(parts: ModelParts, loss: str, config: tuple[tuple[str, float], ...], chunk: int,
                  forward_only: bool):
    """jit: a token loss (learner/token_losses.py) on one TokenMicroBatch, under the raw model distribution.

    forward_only: (lora, base, tmb) -> (loss, logp [B, L]); else (lora, base, grad_acc, tmb) -> (grad_acc + grad,
    loss, logp). The logprobs: learner/token_logprobs.py (GRPO's chunked LM head and fused gradient on each
    datum's window, its prefix detached and shared)."""
    settings = dict(config)

    def loss_fn(lora, base, tmb):
        if chunk > 0:
            logp = token_logprobs(merge(parts._replace(base=base), lora), tmb, parts.hf, chunk, not forward_only)
        else:  # the dense reference: full logits at every position
            logp, _, _ = _logprobs(parts, lora, base, tmb, SamplingTransform(), False, False, chunk)
        return token_loss(loss, logp, tmb.inputs, tmb.loss_mask, settings), logp

    if forward_only:
        return jax.jit(loss_fn)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def fn(lora, base, acc, tmb):
        (value, logp), grads = grad_fn(lora, base, tmb)
        return jax.tree.map(jnp.add, acc, grads), value, logp

    return jax.jit(fn, donate_argnums=(2,))


def make_tenant_fn(parts: ModelParts, loss: str, config: tuple[tuple[str, float], ...], chunk: int,
                   forward_only: bool):
    """make_token_fn for a pass of several adapters stacked (learner/tenant_stack.py; `parts` the stacked graph),
    each row through its own (`rows`, learner/lora_rows.py). forward_only: (lora, base, tmb, rows) -> (per-row loss
    [B], logp); else (lora, base, grad_acc, tmb, rows) -> (grad_acc + grad, per-row loss, logp), the gradient
    stacked as the weights are."""
    settings = dict(config)

    def loss_fn(lora, base, tmb, rows):
        with rows_use(rows):
            if chunk > 0:
                logp = token_logprobs(merge(parts._replace(base=base), lora), tmb, parts.hf, chunk, not forward_only)
            else:
                logp, _, _ = _logprobs(parts, lora, base, tmb, SamplingTransform(), False, False, chunk)
        per_row = token_loss_rows(loss, logp, tmb.inputs, tmb.loss_mask, settings)
        return jnp.sum(per_row), (per_row, logp)

    if forward_only:
        return jax.jit(lambda lora, base, tmb, rows: loss_fn(lora, base, tmb, rows)[1])
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def fn(lora, base, acc, tmb, rows):
        (_, (per_row, logp)), grads = grad_fn(lora, base, tmb, rows)
        return jax.tree.map(jnp.add, acc, grads), per_row, logp

    return jax.jit(fn, donate_argnums=(2,))


def learning_rate(cfg: OptimizerConfig) -> float | optax.Schedule:
    """The learning rate per optimizer update: linear warm-up from 0, then constant or cosine-decayed."""
    after = cfg.lr if cfg.schedule == "constant" else \
        optax.cosine_decay_schedule(cfg.lr, cfg.decay_steps, alpha=cfg.final_lr_ratio)
    if cfg.warmup_steps == 0:
        return after
    after = after if callable(after) else optax.constant_schedule(after)
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), after], [cfg.warmup_steps])


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW (+ global-norm clipping, warm-up and schedule) over the LoRA dict only."""
    lr = learning_rate(cfg)
    adam = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return adam if cfg.max_grad_norm is None else optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adam)


def _adamw_clipped(learning_rate, b1, b2, eps, weight_decay, max_norm):
    return optax.chain(optax.clip_by_global_norm(max_norm),
                       optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))


def make_adam_optimizer() -> optax.GradientTransformation:
    """AdamW (torch.optim.AdamW's decoupled weight decay) behind global-norm clipping, whose every number is set per
    update (`with_adam`): the Tinker API's optim_step carries its AdamParams each time."""
    return optax.inject_hyperparams(_adamw_clipped)(learning_rate=0.0, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0,
                                                    max_norm=jnp.inf)


def with_adam(opt_state: Any, adam: Any) -> Any:
    """`opt_state` of make_adam_optimizer with `adam`'s numbers (learning_rate, beta1, beta2, eps, weight_decay,
    grad_clip_norm: 0 = no clipping) for the next update."""
    values = {"learning_rate": adam.learning_rate, "b1": adam.beta1, "b2": adam.beta2, "eps": adam.eps,
              "weight_decay": adam.weight_decay, "max_norm": adam.grad_clip_norm or jnp.inf}
    hyper = {k: jax.device_put(jnp.asarray(values[k], v.dtype), v.sharding) for k, v in opt_state.hyperparams.items()}
    return opt_state._replace(hyperparams=hyper)


def make_apply_fn(tx: optax.GradientTransformation, lora: Any = None, opt_state: Any = None):
    """jit: (lora, opt_state, grads) -> (new lora, new opt_state, pre-clip grad norm).

    Given the adapter's arrays, the new ones keep their shardings: left to XLA, a LoRA leaf sharded over a mesh
    axis of size 1 came back replicated (an equivalent sharding, but another jit cache key), so the second step
    traced and compiled every step piece again."""

    def fn(lora, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, lora)
        return optax.apply_updates(lora, updates), opt_state, optax.global_norm(grads)

    if lora is None:
        return jax.jit(fn, donate_argnums=(0, 1))
    shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)  # noqa: E731
    first = jax.tree.leaves(lora)[0].sharding
    scalar = NamedSharding(first.mesh, PartitionSpec()) if isinstance(first, NamedSharding) else first
    return jax.jit(fn, donate_argnums=(0, 1), out_shardings=(shardings(lora), shardings(opt_state), scalar))
