"""The LoRA update (x @ A) @ B with a hand-written backward: weight gradients as plain 2-D matmuls over tokens.

Qwix computes a LoRA projection's update with two `dot_general`s over the activations' own shape ([batch, time,
dim]); autodiff then forms d A and d B by contracting *two* axes (batch and time) of 3-D arrays. XLA:CPU lays
those contractions out by fusing a transpose into the producer of the incoming gradient (the MLP's
silu(gate) * up backward), a strided copy of every [tokens, intermediate] activation: measured with
`bench/trace_learner.py --what ours`, the largest single op of a step (2.2 s of a 12.0 s micro-batch). Here the
backward is written out with the token axes flattened, so each weight gradient is one [tokens, k] x [tokens, n]
matmul and nothing large is transposed. Same arithmetic, same values (tests/unit/test_lora_delta.py checks them
against autodiff of Qwix's own function).

`install()` puts `lora_delta` in place of Qwix's `_compute_lora_delta` (Qwix pinned in common/pins.py, and
the function's signature checked) for
the layout every Linear projection uses: the activations' last axis contracted into one output axis, no batch
axes. Any other layout goes to Qwix's own function.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Iterator, Sequence

import jax
from qwix._src.providers import lora as qwix_lora

from common.pins import PINS, require_pinned
from learner import lora_rows

_QWIX_DELTA = qwix_lora._compute_lora_delta
_QWIX_PARAMS = ("lhs", "lora_a", "lora_b", "lhs_ca", "lhs_ba", "contract_shape", "batch_shape", "remain_shape",
                "rank", "precision")


@jax.custom_vjp
def _delta(x: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """(x @ a) @ b for x [..., k], a [k, r], b [r, n]."""
    return (x @ a) @ b


def _delta_fwd(x, a, b):
    h = x @ a
    return h @ b, (x, a, b, h)


def _delta_bwd(residuals, g):
    x, a, b, h = residuals
    gb = g @ b.T  # [..., r]
    # Only here are the token axes flattened. Flattening the forward's activations too (d668d47) cost TPU memory:
    # Qwen2.5-1.5B's preflight on v5e:2x2 gave 5.64 GiB per chip against 3.61; these reshapes cost nothing there.
    tokens = math.prod(x.shape[:-1])
    x2, g2 = x.reshape(tokens, x.shape[-1]), g.reshape(tokens, g.shape[-1])
    h2, gb2 = h.reshape(tokens, h.shape[-1]), gb.reshape(tokens, gb.shape[-1])
    return (gb @ a.T).astype(x.dtype), (x2.T @ gb2).astype(a.dtype), (h2.T @ g2).astype(b.dtype)


_delta.defvjp(_delta_fwd, _delta_bwd)


def lora_delta(lhs: jax.Array, lora_a: jax.Array, lora_b: jax.Array, lhs_ca: Sequence[int], lhs_ba: Sequence[int],
               contract_shape: tuple, batch_shape: tuple, remain_shape: tuple, rank: int,
               precision=None) -> jax.Array:
    """Qwix's `_compute_lora_delta`, through `_delta` for a Linear's layout (the lhs's last axis contracted into one
    output axis, no batch axes); any other layout through Qwix's own. Stacked leaves (A 3-D: a tenant pass, several
    adapters in one batch) go through learner/lora_rows.py, each row with its own adapter."""
    linear = not tuple(lhs_ba) and tuple(lhs_ca) == (lhs.ndim - 1,) and len(remain_shape) == 1 and precision is None
    if lora_a.ndim == 3 and linear:
        rows = lora_rows.current()
        return lora_rows.delta_rows(lhs, lora_a, lora_b, rows.index, rows.scale)
    if tuple(lhs_ba) or tuple(lhs_ca) != (lhs.ndim - 1,) or len(remain_shape) != 1 or precision is not None:
        return _QWIX_DELTA(lhs, lora_a, lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank,
                           precision=precision)
    return _delta(lhs, lora_a, lora_b)


def install() -> None:
    """Route Qwix's LoRA update through `lora_delta`; idempotent. Another Qwix, or a changed function, is an error."""
    require_pinned("qwix", "learner/lora_delta.py")
    lora_rows.install()
    current = qwix_lora._compute_lora_delta
    if current is lora_delta:
        return
    params = tuple(inspect.signature(current).parameters)
    if params != _QWIX_PARAMS:
        raise RuntimeError(f"qwix._src.providers.lora._compute_lora_delta takes {params}, not {_QWIX_PARAMS}: "
                           f"this Qwix is not the pinned one; pin it (qwix=={PINS['qwix']}, "
                           "requirements/learner.lock) or update learner/lora_delta.py")
    qwix_lora._compute_lora_delta = lora_delta


@contextlib.contextmanager
def stock_qwix() -> Iterator[None]:
    """Trace with Qwix's own LoRA update inside this block (bench_learner's Tunix step, the equality tests)."""
    saved = qwix_lora._compute_lora_delta
    qwix_lora._compute_lora_delta = _QWIX_DELTA
    try:
        yield
    finally:
        qwix_lora._compute_lora_delta = saved
