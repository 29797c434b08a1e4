"""The token losses' logprobs: every position's, a gradient only where the loss can have one, each shared prompt once.

The Tinker API returns a logprob for every position of every datum, but a policy-gradient or SFT datum's loss is
zero wherever its gate input is (learner/token_losses.py GATE): at the prompt. So a micro-batch splits each datum at
its gate's first non-zero position (learner/token_batch.py):
- the window (from there on) goes through `window_logprobs` with the fused gradient, as GRPO's completions do;
- the prefix gets its logprobs from the detached hidden states, the LM head forward only (one head matmul per
  position instead of the fused gradient's two, and none of the backward pass);
- with `shared` (learner/shared_prompts.py) the decoder runs each distinct prefix once, and its logprobs are taken
  once per distinct prefix and gathered for the datums that share it.
A position's logprob depends only on its own hidden state, so the values are the plain forward's up to float
rounding, and the loss's gradient is exact: the detached positions carry none (tests/integration/test_shared_prompts.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from learner.logprobs import window_logprobs
from learner.model import forward_hidden, hidden_out
from learner.sampling import SamplingTransform
from learner.shared_prompts import SharedPrompts, prompt_and_window_hidden

RAW = SamplingTransform()  # the Tinker API's logprobs are the raw model distribution's


class Positions(NamedTuple):
    """What `window_logprobs` reads of a micro-batch: its tokens and targets, which positions to take, and the
    mask of those that count (the rest come back 0)."""

    tokens: jax.Array
    targets: jax.Array
    valid: jax.Array
    loss_mask: jax.Array
    window: jax.Array


def token_logprobs(model, tmb, hf: dict[str, Any], chunk: int, fused_grad: bool) -> jax.Array:
    """[B, L]: log p(target | input so far) at every real position of the micro-batch `tmb` (train_step's
    TokenMicroBatch), the gradient flowing only through its window's."""
    window = Positions(tmb.tokens, tmb.targets, tmb.valid, tmb.active_mask, tmb.window)
    width = tmb.window.shape[1]
    if tmb.shared is not None:
        head = hidden_out(model)
        hidden, prompt_hidden = prompt_and_window_hidden(model, tmb.shared, hf, width)
    else:
        hidden, head = forward_hidden(model, tmb.tokens, tmb.valid)
    vocab = jax.eval_shape(head, jax.ShapeDtypeStruct((1, hidden.shape[-1]), hidden.dtype)).shape[-1]
    logp = window_logprobs(hidden, head, vocab, window, RAW, chunk, False, False, fused_grad,
                           at_window=tmb.shared is not None)[0]
    if tmb.shared is not None:
        return logp + shared_prefix_logprobs(jax.lax.stop_gradient(prompt_hidden), head, vocab, tmb, chunk)
    if tmb.prefix_window is None:
        return logp
    prefix = Positions(tmb.tokens, tmb.targets, tmb.valid, tmb.prefix_mask, tmb.prefix_window)
    return logp + window_logprobs(jax.lax.stop_gradient(hidden), head, vocab, prefix, RAW, chunk, False, False)[0]


def shared_prefix_logprobs(prompt_hidden: jax.Array, head, vocab: int, tmb, chunk: int) -> jax.Array:
    """[B, L]: each datum's prefix logprobs, taken once per distinct prompt row of `tmb.shared` and gathered.

    A prompt row holds a datum's tokens[: start + 1] left-padded to P, so its slot pad + j holds token j and
    predicts token j + 1, the datum's target j (the layout is only used where every prefix's targets are its next
    tokens: `PackedTokens.shareable`); slot P - 1 predicts the window's first target and is the window's."""
    sp: SharedPrompts = tmb.shared
    u, p = sp.prompt_tokens.shape
    next_tokens = jnp.pad(sp.prompt_tokens[:, 1:], ((0, 0), (0, 1)))
    has_next = sp.prompt_valid & jnp.pad(sp.prompt_valid[:, 1:], ((0, 0), (0, 1)))
    slots = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (u, p))
    rows = Positions(sp.prompt_tokens, next_tokens, sp.prompt_valid, has_next.astype(jnp.float32), slots)
    per_prompt = window_logprobs(prompt_hidden, head, vocab, rows, RAW, chunk, False, False, at_window=True)[0]
    length = tmb.tokens.shape[1]
    pad = (p - sp.prompt_length)[:, None]
    slot = jnp.clip(pad + jnp.arange(length)[None], 0, p - 1)
    gathered = per_prompt[sp.row_prompt[:, None], slot]
    return jnp.where(tmb.prefix_mask > 0, gathered, 0.0)
