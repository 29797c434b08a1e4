"""Prompt sharing: a GRPO group's n samples share one prompt, so the decoder runs each distinct prompt once.

A micro-batch's rows are normally `prompt + completion` each, so a group of n samples runs its prompt through
every layer n times, forward and backward. Here the micro-batch becomes two blocks:
1. the distinct prompts [U, P], left-padded, with a KV cache of P + C slots: one pass fills slots [0, P);
2. the completions [B, C], each row reading its prompt's cache (gathered, so the gradient of every sample
   flows back into its one prompt pass) and writing slots [P, P + C).
The hidden state that predicts completion token j is the prompt's last one for j = 0 and completion position
j - 1 after that, which is all the logprobs need (`window_hidden`). Equal to the plain forward up to float
rounding (tests/integration/test_shared_prompts.py): left padding makes every cache-slot distance equal to the
position distance, so causal masks and rope (positions are passed explicitly) are unchanged.

Tunix's Gemma 3 computes its sliding-window mask from slot indices of the current call, which are off by P in
the completion pass: sharing applies to it only when P + C fits in the window (`max_span`), where that mask
keeps everything anyway. Host side, `layout` picks the block sizes once per step (one compile per bucket) and
says None when sharing would not save tokens (distinct prompts everywhere, as in a batch of one sample each).
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from learner.batch import PackedBatch, ShapeFloor, bucket_length
from learner.lora_rows import RowAdapters, current, rows_use
from learner.model import head_dim


class SharedPrompts(NamedTuple):
    """One micro-batch as distinct prompts + completions (numpy on the host, jax.Array inside the step)."""

    prompt_tokens: Any  # int32 [U, P], left-padded
    prompt_valid: Any  # bool [U, P]
    row_prompt: Any  # int32 [B]: which prompt row each sample continues
    completion_tokens: Any  # int32 [B, C]: the tokens after the prompt (right-padded)
    completion_valid: Any  # bool [B, C]
    prompt_length: Any  # int32 [B]: the sample's prompt length (its completion's first position)
    prompt_tag: Any = None  # int32 [U]: in a pass of several adapters, each prompt row's (rows share a prompt
    # only with rows of their own adapter); None otherwise


class Layout(NamedTuple):
    prompts: int  # U: prompt rows per micro-batch
    prompt_len: int  # P
    completion_len: int  # C


def _prompt_lengths(packed: PackedBatch) -> np.ndarray:
    # window[:, 0] is the position predicting the first completion token: the prompt's last one.
    return packed.window[:, 0].astype(np.int64) + 1


def _distinct(packed: PackedBatch, rows: slice, tags: np.ndarray | None = None
              ) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """(distinct (tag, prompt) of these rows, in first-seen order; each row's index among them). `tags`: per row of
    `packed`, what else a row must share with another to share its prompt (its adapter), or None."""
    lengths = _prompt_lengths(packed)
    index: dict[tuple[int, ...], int] = {}
    row_prompt = []
    for i in range(rows.start, rows.stop):
        key = (int(tags[i]) if tags is not None else 0, *packed.tokens[i, : lengths[i]].tolist())
        row_prompt.append(index.setdefault(key, len(index)))
    return list(index), np.asarray(row_prompt, np.int32)


def layout(packed: PackedBatch, micro: int, data_parallel: int, bucket: int, max_span: int | None,
           floor: ShapeFloor | None = None, tags: np.ndarray | None = None) -> Layout | None:
    """Block sizes for every micro-batch of `packed` (rows grouped so a group's samples are adjacent), at least
    `floor`'s prompt block, or None where sharing would run as many tokens as the plain [B, L] forward (or cannot
    apply, see `max_span`)."""
    floor = floor or ShapeFloor()
    rows, length = packed.tokens.shape
    most = max(len(_distinct(packed, slice(lo, lo + micro), tags)[0]) for lo in range(0, rows, micro))
    prompts = max(-(-most // data_parallel) * data_parallel, floor.prompts)  # sharded like the batch
    prompt_len = max(bucket_length(int(_prompt_lengths(packed).max()), bucket), floor.prompt_len)
    completion_len = packed.window.shape[1]
    if max_span is not None and prompt_len + completion_len > max_span:
        return None
    if prompts * prompt_len + micro * completion_len >= micro * length:
        return None
    return Layout(prompts, prompt_len, completion_len)


def shared_prompts(packed: PackedBatch, rows: slice, lay: Layout, tags: np.ndarray | None = None) -> SharedPrompts:
    """The rows `rows` of `packed` as a prompt block and a completion block of the sizes in `lay` (`tags`: see
    `_distinct`; each prompt row then carries its rows' tag)."""
    distinct, row_prompt = _distinct(packed, rows, tags)
    u, p, c = lay
    prompt_tokens = np.zeros((u, p), np.int32)
    prompt_valid = np.zeros((u, p), bool)
    prompt_tag = np.zeros(u, np.int32)
    for k, (tag, *prompt) in enumerate(distinct):
        prompt_tokens[k, p - len(prompt):] = prompt
        prompt_valid[k, p - len(prompt):] = True
        prompt_tag[k] = tag
    lengths = _prompt_lengths(packed)[rows]
    b, length = len(lengths), packed.tokens.shape[1]
    completion_tokens = np.zeros((b, c), np.int32)
    completion_valid = np.zeros((b, c), bool)
    for i, (row, start) in enumerate(zip(range(rows.start, rows.stop), lengths)):
        stop = min(start + c, length)
        completion_tokens[i, : stop - start] = packed.tokens[row, start:stop]
        completion_valid[i, : stop - start] = packed.valid[row, start:stop]
    return SharedPrompts(prompt_tokens, prompt_valid, row_prompt, completion_tokens, completion_valid,
                         lengths.astype(np.int32), None if tags is None else prompt_tag)


def put_shared(sp: SharedPrompts, put) -> SharedPrompts:
    """`sp` with `put` applied to each array it has (a field it lacks stays None)."""
    return SharedPrompts(*(None if x is None else put(x) for x in sp))


def _empty_cache(hf: dict[str, Any], batch: int, slots: int, dtype) -> dict:
    zeros = jnp.zeros((batch, slots, hf["num_key_value_heads"], head_dim(hf)), dtype)
    return {f"layer_{i}": {"k": zeros, "v": zeros, "end_index": jnp.zeros((batch,), jnp.int32)}
            for i in range(hf["num_hidden_layers"])}


def window_hidden(model, sp: SharedPrompts, hf: dict[str, Any], width: int) -> jax.Array:
    """[B, width, D]: the hidden state predicting each completion token (the model's LM head already switched
    to the identity by `model.hidden_out`)."""
    return prompt_and_window_hidden(model, sp, hf, width)[0]


def prompt_and_window_hidden(model, sp: SharedPrompts, hf: dict[str, Any], width: int) -> tuple[jax.Array, jax.Array]:
    """(`window_hidden`'s [B, width, D], the prompt block's own hidden states [U, P, D]: slot t predicts the
    prompt's token at slot t + 1, which the token losses' logprobs at prompt positions read)."""
    dtype = model.embedder.input_embedding[...].dtype  # the weights' dtype: what k and v projections produce
    u, p = sp.prompt_tokens.shape
    c = sp.completion_tokens.shape[1]
    slots = p + c
    # 1. Distinct prompts: positions count from each prompt's first real token; pad queries see only themselves.
    pad = p - jnp.sum(sp.prompt_valid, axis=1, keepdims=True)
    positions = jnp.maximum(jnp.arange(p)[None] - pad, 0).astype(jnp.int32)
    t, s = jnp.arange(p)[:, None], jnp.arange(slots)[None]
    keys = jnp.pad(sp.prompt_valid, ((0, 0), (0, c)))
    mask = ((s <= t)[None] & keys[:, None, :]) | (s == t)[None]
    # In a pass of several adapters each prompt row runs through its rows' adapter (learner/lora_rows.py).
    prompt_rows = contextlib.nullcontext() if sp.prompt_tag is None else rows_use(RowAdapters(sp.prompt_tag,
                                                                                              current().slot_scale))
    with prompt_rows:
        prompt_hidden, cache = model(sp.prompt_tokens, positions, _empty_cache(hf, u, slots, dtype), mask)
    # 2. Completions on their prompt's cache (slots [0, P) filled; they write [P, P + C)).
    cache = {name: {"k": layer["k"][sp.row_prompt], "v": layer["v"][sp.row_prompt],
                    "end_index": jnp.full(sp.row_prompt.shape, p, jnp.int32)} for name, layer in cache.items()}
    positions = sp.prompt_length[:, None] + jnp.arange(c, dtype=jnp.int32)[None]
    t = jnp.arange(c)[:, None]
    own = (s - p <= t)[None] & (s >= p)[None] & jnp.pad(sp.completion_valid, ((0, 0), (p, 0)))[:, None, :]
    mask = keys[sp.row_prompt][:, None, :] | own | (s == p + t)[None]
    completion_hidden, _ = model(sp.completion_tokens, positions, cache, mask)
    first = prompt_hidden[sp.row_prompt, p - 1][:, None]
    return jnp.concatenate([first, completion_hidden], axis=1)[:, :width], prompt_hidden
