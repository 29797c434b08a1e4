"""Logprobs under the sampling transform with bounded memory: LM head and log-softmax at completion positions only,
a chunk of positions at a time, and truncation masks without a full-vocabulary sort.

`window_logprobs` takes the final hidden states [B, L, D], gathers the completion window [B, W] (W = the
longest completion, bucketed), and maps over even chunks of at most `chunk` positions: per chunk it applies the LM head
([B, chunk, V] fp32, the largest array), the engine's processing (min_tokens, penalties, temperature, min-p,
top-k, top-p) and the log-softmax. The results are scattered back to [B, L]. The [B, W, V] logits never exist
at once, forward or backward:
- `fused_grad` (a train step's loss): each chunk also computes J = d logp / d hidden [B, chunk, D] in the forward
  pass (Liger's fused linear cross-entropy idea). A position's logp depends on its own hidden state only (the
  head is per position; the penalties' counts come from the sampled tokens, the truncation mask is held fixed),
  so the backward pass is cotangent * J: the head runs twice per position (forward, d hidden) instead of three
  times (forward, again in a rematerialised backward, d hidden), and only J is kept, not the logits.
- otherwise each chunk is rematerialised in the backward pass (`jax.checkpoint`): plain autodiff, the reference
  `fused_grad` is tested against, and free where no gradient is taken (old and reference logprobs).

Truncation masks (`keep_mask`), exact with respect to the dense reference `loss.dense_sampling_logprobs`:
- min-p: one max.
- top-k: `lax.top_k` of size k (a partial selection, no full sort).
- top-p with top-k on: the candidates are the k values top-k already returned, sorted; the prefix mass over them
  (normalised by the full kept mass) finds the same threshold as the dense sort, because every kept token
  beyond the k-th ties with the k-th.
- top-p alone: token v is kept by the dense rule iff the mass of tokens *strictly* above it is < top_p (the first
  of equal values in sorted order has exactly that mass before it). That mass g(t) is non-increasing in t, so the
  smallest kept value is found by bisection on t over float32's order-preserving integer keys: 32 halvings of
  the 2^32 keys end on adjacent keys (lo, hi] with g(lo) >= top_p > g(hi), so a token value equals hi and it is
  the threshold. Equal up to float rounding of the mass sums (a different summation order than a cumsum).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from learner.loss import sampling_entropy
from learner.sampling import SamplingTransform

_SIGN_OFF = np.int32(0x7FFFFFFF)  # the magnitude bits of a float32


def _float_key(x: jax.Array) -> jax.Array:
    """float32 -> int32 whose order is the floats' order (the xor is its own inverse)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return bits ^ ((bits >> 31) & _SIGN_OFF)


def _key_float(key: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(key ^ ((key >> 31) & _SIGN_OFF), jnp.float32)


def _top_p_threshold_sorted(vals: jax.Array, masked: jax.Array, top_p: float) -> jax.Array:
    """Threshold from the top-k values `vals` (descending): the dense rule restricted to the candidates."""
    mx = vals[..., :1]
    total = jnp.sum(jnp.exp(masked - mx), axis=-1, keepdims=True)
    probs = jnp.exp(vals - mx) / total
    before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.maximum(jnp.sum(before < top_p, axis=-1, keepdims=True), 1)
    return jnp.take_along_axis(vals, n_keep - 1, axis=-1)


def _top_p_threshold_bisect(masked: jax.Array, top_p: float) -> jax.Array:
    """Smallest value v with mass(> v) < top_p, by bisection on float keys (see the module docstring)."""
    mx = jnp.max(masked, axis=-1, keepdims=True)
    e = jnp.exp(masked - mx)
    probs = e / jnp.sum(e, axis=-1, keepdims=True)
    lowest = jnp.min(jnp.where(jnp.isfinite(masked), masked, mx), axis=-1, keepdims=True)
    lo = _float_key(lowest) - 1  # mass above = all of it >= top_p
    hi = _float_key(mx)  # mass above the max = 0 < top_p

    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo & hi) + ((lo ^ hi) >> 1)  # floor((lo + hi) / 2) without int32 overflow
        above = jnp.sum(jnp.where(masked > _key_float(mid), probs, 0.0), axis=-1, keepdims=True)
        small = above < top_p
        return jnp.where(small, lo, mid), jnp.where(small, mid, hi)

    _, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return _key_float(hi)


def keep_mask(scaled: jax.Array, s: SamplingTransform) -> jax.Array:
    """Tokens the engine could sample: min-p, then top-k, then top-p, on tempered logits (no full sort)."""
    keep = jnp.ones(scaled.shape, bool)
    if s.min_p > 0.0:
        # p_j >= min_p * p_max  <=>  z_j >= z_max + log(min_p)
        keep &= scaled >= jnp.max(scaled, axis=-1, keepdims=True) + jnp.log(s.min_p)
    vals = None
    if s.top_k > 0 and s.top_k < scaled.shape[-1]:
        vals = jax.lax.top_k(jnp.where(keep, scaled, -jnp.inf), s.top_k)[0]
        keep &= scaled >= vals[..., -1:]
    if s.top_p < 1.0:
        masked = jnp.where(keep, scaled, -jnp.inf)
        if vals is not None:
            threshold = _top_p_threshold_sorted(vals, masked, s.top_p)
        else:
            threshold = _top_p_threshold_bisect(masked, s.top_p)
        keep &= scaled >= threshold
    return keep


class History(NamedTuple):
    """What a chunk's processing needs from earlier tokens: completion slot index, counts, prompt ids."""

    slot: jax.Array  # int32 [B, c]: which completion token each position predicts (0 = the first)
    counts: jax.Array | None  # float32 [B, c, V]: earlier completion tokens, per id (None: no penalties)
    prompt_seen: jax.Array | None  # bool [B, V]: ids in the prompt (None: no repetition penalty)


def engine_logits(logits: jax.Array, s: SamplingTransform, h: History) -> jax.Array:
    """vLLM's processing before temperature: min_tokens mask, then repetition, frequency, presence penalties."""
    z = logits
    vocab = z.shape[-1]
    if s.masks_stop:
        stop = jnp.zeros((vocab,), bool).at[jnp.asarray(s.stop_token_ids)].set(True, mode="drop")
        z = jnp.where((h.slot < s.min_tokens)[..., None] & stop, -jnp.inf, z)
    if s.repetition_penalty != 1.0:
        seen = h.prompt_seen[:, None, :] | (h.counts > 0)
        r = np.float32(s.repetition_penalty)
        # vLLM multiplies by 1/r (computed in float32) for positive logits, by r otherwise.
        z = jnp.where(seen, z * jnp.where(z > 0, np.float32(1.0) / r, r), z)
    if s.frequency_penalty != 0.0:
        z = z - np.float32(s.frequency_penalty) * h.counts
    if s.presence_penalty != 0.0:
        z = z - np.float32(s.presence_penalty) * (h.counts > 0)
    return z


def transform_logprobs(
    logits: jax.Array, targets: jax.Array, s: SamplingTransform, with_entropy: bool, history: History | None,
    raw: bool, entropy_grad: bool = False,
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """(logp under the transform, its entropy or None, untransformed logp or None) for logits [..., V]; the entropy
    is detached unless `entropy_grad`."""
    f32 = logits.astype(jnp.float32)
    raw_logp = None
    if raw:
        raw_logp = jnp.take_along_axis(f32, targets[..., None], axis=-1)[..., 0] - jax.nn.logsumexp(f32, axis=-1)
    z = engine_logits(f32, s, history) if s.needs_history else f32
    scaled = z / s.temperature
    if s.truncates:
        keep = keep_mask(jax.lax.stop_gradient(scaled), s)
        # The sampled token stays in the support even where the learner's numerics put it just outside.
        keep |= jax.lax.broadcasted_iota(jnp.int32, scaled.shape, scaled.ndim - 1) == targets[..., None]
        scaled = jnp.where(keep, scaled, -jnp.inf)
    lse = jax.nn.logsumexp(scaled, axis=-1)
    logp = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0] - lse
    entropy = sampling_entropy(scaled, lse, entropy_grad) if with_entropy else None
    return logp, entropy, raw_logp


def _history(s: SamplingTransform, all_targets, all_mask, slot, targets, mask, prompt_seen, vocab: int) -> History:
    """A chunk's History: counts of the completion tokens before each position (prefix before the chunk,
    plus an exclusive cumsum inside it), so no [B, W, V] count tensor is ever built."""
    if not s.penalises:
        return History(slot, None, None)
    rows = jnp.arange(all_targets.shape[0])[:, None]
    before = all_mask * (jnp.arange(all_targets.shape[1])[None] < slot[:, :1])
    base = jnp.zeros((all_targets.shape[0], vocab), jnp.float32).at[rows, all_targets].add(before)
    onehot = jax.nn.one_hot(targets, vocab, dtype=jnp.float32) * mask[..., None]
    counts = base[:, None, :] + jnp.cumsum(onehot, axis=1) - onehot
    return History(slot, counts, prompt_seen)


def _prompt_seen(tokens: jax.Array, valid: jax.Array, window: jax.Array, vocab: int) -> jax.Array:
    """bool [B, V]: ids among each row's prompt tokens (positions up to the one predicting the first completion
    token, window[:, 0])."""
    pos = jnp.arange(tokens.shape[1])[None]
    in_prompt = valid & (pos <= window[:, :1])
    rows = jnp.arange(tokens.shape[0])[:, None]
    return jnp.zeros((tokens.shape[0], vocab), bool).at[rows, tokens].max(in_prompt)


def balanced_chunks(width: int, chunk: int) -> tuple[int, int]:
    """(n, c): `width` positions in n = ceil(width / chunk) chunks of c <= `chunk` positions, as even as they go
    (a multiple of 8 where that stays <= `chunk`). Not n - 1 full chunks and a padded last one: a window of 192 in
    chunks of 128 would run the LM head at 256 positions, 96 of 192 does it at 192."""
    n = -(-width // chunk)
    even = -(-width // n)
    rounded = -(-even // 8) * 8
    return n, rounded if rounded <= chunk else even


def window_logprobs(
    hidden: jax.Array, head: Callable[[jax.Array], jax.Array], vocab: int, mb, s: SamplingTransform, chunk: int,
    with_entropy: bool, raw: bool, fused_grad: bool = False, at_window: bool = False, entropy_grad: bool = False,
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """[B, L] logp (and entropy, raw logp) at the completion window of micro-batch `mb` ([B, L, K] for [B, L, K]
    targets: soft targets under the raw distribution, no entropy), at most `chunk` positions
    at a time (`balanced_chunks`); zero outside the completion. `head`: hidden [B, c, D] -> logits [B, c, V].
    `hidden` is [B, L, D], or with `at_window` already the window's [B, W, D] (`shared_prompts.window_hidden`).
    With `fused_grad` logp's gradient with respect to `hidden` is taken in the forward pass, and so is the entropy's
    with `entropy_grad` (the entropy bonus); otherwise the entropy is detached. Raw logp is only ever compared,
    detached."""
    tokens, all_targets, valid, loss_mask, window = map(jnp.asarray, (mb.tokens, mb.targets, mb.valid,
                                                                      mb.loss_mask, mb.window))
    b, length = tokens.shape
    width = window.shape[1]
    n, chunk = balanced_chunks(width, chunk)
    win = jnp.pad(window, ((0, 0), (0, n * chunk - width)), mode="edge")
    rows = jnp.arange(b)[:, None]
    slots = jnp.broadcast_to(jnp.arange(n * chunk, dtype=jnp.int32), win.shape)
    targets = all_targets[rows, win]
    mask = loss_mask[rows, win] * (slots < width)
    prompt_seen = None
    if s.repetition_penalty != 1.0:
        prompt_seen = _prompt_seen(tokens, valid, window, vocab)

    def one(xs):
        h, t, m, j = xs
        if t.ndim == h.ndim:  # [B, c, K] targets: soft targets under the raw distribution (the token losses')
            return soft_target_logprobs(head(h), t), None, None
        hist = _history(s, targets, mask, j, t, m, prompt_seen, vocab) if s.needs_history else None
        return transform_logprobs(head(h), t, s, with_entropy, hist, raw, entropy_grad)

    def fused(xs):
        # Exact for the gradient with respect to hidden (and so the decoder's LoRA). The head's own weights are
        # frozen base weights (LoRA targets decoder projections only); were they differentiated, autodiff would
        # still be right but would keep each chunk's logits for their backward pass.
        h = xs[0]
        n_diff = 2 if entropy_grad else 1  # logp, and the entropy when it has a gradient

        def differentiated_and_rest(hh):  # the rest (raw logp, a detached entropy) rides along undifferentiated
            out = one((hh, *xs[1:]))
            return out[:n_diff], out[n_diff:]

        values, pull, rest = jax.vjp(differentiated_and_rest, jax.lax.stop_gradient(h), has_aux=True)
        with_grad = []
        for i, v in enumerate(values):  # one pull per value: d value_i / d h_i (a position's own hidden state only)
            jac = jax.lax.stop_gradient(pull(tuple(jnp.ones_like(w) if j == i else jnp.zeros_like(w)
                                                   for j, w in enumerate(values)))[0]).astype(jnp.float32)
            # Value: exactly v (x - x is 0); gradient with respect to h: jac.
            x = jnp.sum(h.astype(jnp.float32) * jac, axis=-1)
            with_grad.append(v + (x - jax.lax.stop_gradient(x)))
        return (*with_grad, *rest)

    split = lambda x: x.reshape(b, n, chunk, *x.shape[2:]).swapaxes(0, 1)
    if at_window:
        at = jnp.pad(hidden, ((0, 0), (0, n * chunk - width), (0, 0)))
    else:
        at = hidden[rows, win]
    soft = targets.ndim == 3
    if soft and s != SamplingTransform():
        raise ValueError(f"[N, K] targets are scored under the raw distribution, not {s}")
    # [N, K] targets take the rematerialised chunk: a fused J per target would grow with K.
    outs = jax.lax.map(fused if fused_grad and not soft else jax.checkpoint(one),
                       (split(at), split(targets), split(mask), split(slots)))
    if soft:
        k = targets.shape[2]
        spread = lambda o: jnp.zeros((b, length, k), jnp.float32).at[rows, win].add(  # noqa: E731
            jnp.where((mask > 0)[..., None], o.swapaxes(0, 1).reshape(b, n * chunk, k), 0.0))
        return spread(outs[0]), None, None
    full = lambda o: None if o is None else jnp.zeros((b, length), jnp.float32).at[rows, win].add(
        jnp.where(mask > 0, o.swapaxes(0, 1).reshape(b, n * chunk), 0.0))
    return tuple(full(o) for o in outs)


def soft_target_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """[..., K]: the raw distribution's logprob of each of K targets per position (logits [..., V])."""
    f32 = logits.astype(jnp.float32)
    return jnp.take_along_axis(f32, targets, axis=-1) - jax.nn.logsumexp(f32, axis=-1)[..., None]
