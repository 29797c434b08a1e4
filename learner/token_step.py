"""forward_backward of a token loss (learner/token_losses.py) on a TokenBatch, for one adapter of the learner.

The datums are packed into bucketed [rows, L] arrays (each split into a prefix without gradient and a window
with one: learner/token_batch.py) and run in micro-batches of `learner.grpo.micro_batch_size` (rounded to the
data-parallel size, as GRPO's are), through GRPO's chunked logprob code and gradient accumulation
(learner/token_logprobs.py); datums of a micro-batch that share a prefix run it once where the learner's
prompt sharing says it saves tokens. The sum of the micro-batches' gradients is added to the adapter's held
gradient.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from learner import train_step as ts
from learner.adapters import Adapter, OpenUpdate
from learner.batch import ShapeFloor
from learner.compile_time import compile_seconds
from learner.config import LearnerConfig
from learner.distributed import put_global, to_host
from learner.lora_rows import RowAdapters
from learner.tenant_stack import TenantStack, unstack
from learner.token_batch import PackedTokens, TokenBatch, pack_tokens
from learner.shared_prompts import Layout, put_shared, shared_prompts
from learner.token_losses import GATE, TOKEN_LOSSES, loss_config


def token_forward_backward(cfg: LearnerConfig, a: Adapter, batch: TokenBatch, loss: str,
                           config: dict[str, float] | None, forward_only: bool, sharding: Any,
                           share: Callable[[Any, int, ShapeFloor | None], Layout | None],
                           floor: ShapeFloor) -> tuple[dict[str, Any], Layout | None]:
    """({"loss": the summed loss, "logprobs": per datum its [N] target logprobs under the raw model, before the
    update}, the prompt-sharing layout used or None); without `forward_only`, the loss's gradient is added to
    `a.grads` for the next optim_step. `sharding`: the learner's batch sharding (rows over its data-parallel axis);
    `share(packed, micro, floor)`: the learner's prompt-sharing layout for these rows, or None; `floor`: the
    largest token-loss shapes run so far, padded up to and raised (with cfg.pad_to_largest: a client's RL loop
    sends other lengths every step, each a compile otherwise)."""
    t0, compiled_before = time.perf_counter(), compile_seconds()
    settings, names, packed, lay, micro = _prepare(cfg, batch, loss, config, sharding, share, floor)
    key = ("token", loss, settings, forward_only)
    if key not in a.fns:
        a.fns[key] = ts.make_token_fn(a.parts, loss, settings, cfg.logprob_chunk, forward_only)
    fn = a.fns[key]
    acc = None if forward_only else (a.grads if a.grads is not None else jax.tree.map(jnp.zeros_like, a.params))
    total, logps = 0.0, []
    for r, tmb in _micro_batches(packed, lay, names, micro, sharding):
        if forward_only:
            value, logp = fn(a.params, a.parts.base, tmb)
        else:
            acc, value, logp = fn(a.params, a.parts.base, acc, tmb)
        total += float(value)
        logps.append(to_host(logp))
    if not forward_only:
        a.grads = acc
        a.open = a.open or OpenUpdate(t0, compiled_before)
    return {"loss": total, "logprobs": datum_logprobs(np.concatenate(logps), batch)}, lay


def tenant_forward_backward(cfg: LearnerConfig, adapters: list[Adapter], stack: TenantStack, fns: dict,
                            batch: TokenBatch, loss: str, config: dict[str, float] | None, forward_only: bool,
                            sharding: Any, share: Callable[..., Layout | None], floor: ShapeFloor) -> dict[str, Any]:
    """token_forward_backward for the datums of several adapters in one pass (`batch.adapters` names each datum's;
    `stack` holds them stacked, learner/tenant_stack.py; `fns` caches the stacked graph's programs): {"loss": per
    datum its summed loss, "logprobs": per datum, "compile_s": seconds spent making the pass's program, "layout":
    the prompt-sharing layout used or None}; each adapter's gradient is added to its own held one.
    Rows share a prompt only with rows of their own adapter (`share(packed, micro, floor, tags)`: the learner's
    prompt-sharing layout, its prompts told apart by adapter slot)."""
    t0, compiled_before = time.perf_counter(), compile_seconds()
    index, slot_scale = stack.rows(list(batch.adapters))
    rows_of = lambda packed: np.pad(index, (0, len(packed.tokens) - len(index)))  # noqa: E731  (padding: slot 0)
    tagged = lambda packed, micro, pad: share(packed, micro, pad, rows_of(packed))  # noqa: E731
    settings, names, packed, lay, micro = _prepare(cfg, batch, loss, config, sharding, tagged, floor)
    index = rows_of(packed)
    key = ("tenants", loss, settings, forward_only)
    if key not in fns:
        fns[key] = ts.make_tenant_fn(stack.parts, loss, settings, cfg.logprob_chunk, forward_only)
    fn = fns[key]
    acc = None if forward_only else jax.tree.map(jnp.zeros_like, stack.params)
    put = lambda x: put_global(x, sharding)  # noqa: E731
    scale = put_global(slot_scale, NamedSharding(sharding.mesh, PartitionSpec()))  # every row may read any slot's
    losses, logps = [], []
    compiled = compile_seconds()
    for r, tmb in _micro_batches(packed, lay, names, micro, sharding, index):
        rows = RowAdapters(put(index[r]), scale)
        if forward_only:
            per_row, logp = fn(stack.params, stack.parts.base, tmb, rows)
        else:
            acc, per_row, logp = fn(stack.params, stack.parts.base, acc, tmb, rows)
        losses.append(to_host(per_row))
        logps.append(to_host(logp))
    compiled = compile_seconds() - compiled
    if not forward_only:
        for a, grads in zip(adapters, unstack(acc, adapters)):
            a.grads = grads if a.grads is None else jax.tree.map(jnp.add, a.grads, grads)
            a.open = a.open or OpenUpdate(t0, compiled_before)
    per_datum = np.concatenate(losses)
    return {"loss": [float(per_datum[i]) for i in range(len(batch))],
            "logprobs": datum_logprobs(np.concatenate(logps), batch),
            "compile_s": compiled, "layout": lay}


def datum_logprobs(logp: np.ndarray, batch: TokenBatch) -> list[np.ndarray]:
    """Each datum's logprobs in its targets' shape ([N], or [N, K]) from the packed [rows, L] or [rows, L, K]."""
    out = []
    for i, (x, y) in enumerate(zip(batch.tokens, batch.targets)):
        values = logp[i, : len(x)]
        if values.ndim == 2:
            values = values[:, : np.shape(y)[1]] if np.ndim(y) == 2 else values[:, 0]
        out.append(values.astype(np.float32))
    return out


def _prepare(cfg: LearnerConfig, batch: TokenBatch, loss: str, config: dict[str, float] | None, sharding: Any,
             share: Callable[[Any, int, ShapeFloor | None], Layout | None] | None, floor: ShapeFloor):
    """(the loss's settings, its input names, the packed batch, its prompt-sharing layout or None, micro-batch
    rows), the inputs checked against the loss and the floor raised to the batch's shapes."""
    settings = loss_config(loss, config)
    names = TOKEN_LOSSES[loss]
    if batch.width and loss != "cross_entropy":
        raise ValueError(f"[N, K] target_tokens (soft targets) are for cross_entropy, not {loss!r}; give [N] targets")
    if batch.width and cfg.logprob_chunk == 0:
        raise ValueError("[N, K] target_tokens need learner.logprob_chunk > 0 (the dense reference scores one target "
                         "per position)")
    for i, inputs in enumerate(batch.inputs or [{}] * len(batch)):
        if missing := [n for n in names if n not in inputs]:
            raise ValueError(f"datum {i}: loss_fn {loss!r} needs loss_fn_inputs {list(names)} besides "
                             f"target_tokens; {missing} missing")
    dp = sharding.mesh.shape["fsdp"]
    micro = math.ceil(min(cfg.grpo.micro_batch_size, len(batch)) / dp) * dp
    rows = math.ceil(len(batch) / micro) * micro
    pad = floor if cfg.pad_to_largest else None
    packed = pack_tokens(batch, names, GATE[loss], cfg.seq_bucket, rows, pad)
    lay = share(packed, micro, pad) if share and packed.shareable and cfg.logprob_chunk > 0 else None
    floor.raise_to(packed, lay.prompts if lay else 0, lay.prompt_len if lay else 0,
                   0 if packed.prefix_window is None else packed.prefix_window.shape[1])
    return settings, names, packed, lay, micro


def _micro_batches(packed: PackedTokens, lay: Layout | None, names: tuple[str, ...], micro: int, sharding: Any,
                   tags: np.ndarray | None = None) -> Iterator[tuple[slice, ts.TokenMicroBatch]]:
    """(rows, device arrays) of each micro-batch of `packed` (`tags`: per row its adapter slot, which prompt rows
    are told apart by)."""
    put = lambda x: put_global(x, sharding)  # noqa: E731
    for lo in range(0, len(packed.tokens), micro):
        r = slice(lo, lo + micro)
        shared = None if lay is None else put_shared(shared_prompts(packed, r, lay, tags), put)
        # Shared, the prefixes' logprobs come from the prompt block: no [B, S] window (nor its shape in jit's key).
        prefix_window = None if lay is not None or packed.prefix_window is None else put(packed.prefix_window[r])
        yield r, ts.TokenMicroBatch(put(packed.tokens[r]), put(packed.targets[r]), put(packed.valid[r]),
                                    put(packed.loss_mask[r]), put(packed.window[r]),
                                    {n: put(packed.fields[n][r]) for n in names}, put(packed.active_mask[r]),
                                    put(packed.prefix_mask[r]), prefix_window, shared)
