"""The LoRA update (x @ A) @ B with a hand-written backward: weight gradients as plain 2-D matmuls over tokens.

Qwix computes a LoRA projection's update with two `dot_general`s over the activations' own shape ([batch, time,
dim]); autodiff then forms d A and d B by contracting *two* axes (batch and time) of 3-D arrays. XLA:CPU lays
those contractions out by fusing a transpose into the producer of the incoming gradient (the MLP's
silu(gate) * up backward), a strided copy of every [tokens, intermediate] activation: measured with
`bench/trace_learner.py`, the largest single op of a step (14% of the decoder's op time). Here the token axes
are flattened first and the backward is written out, so each gradient is one [tokens, k] x [tokens, n] matmul and
nothing large is transposed. Same arithmetic, same values (tests/unit/test_lora_delta.py checks them against
autodiff of Qwix's own function).

`install()` puts `lora_delta` in place of Qwix's `_compute_lora_delta` (pinned Qwix, checked by signature) for
the layout every Linear projection uses: contraction over the trailing axes, no batch axes. Any other layout
goes to Qwix's own function.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Iterator, Sequence

import jax
from qwix._src.providers import lora as qwix_lora

_QWIX_DELTA = qwix_lora._compute_lora_delta
_QWIX_PARAMS = ("lhs", "lora_a", "lora_b", "lhs_ca", "lhs_ba", "contract_shape", "batch_shape", "remain_shape",
                "rank", "precision")


@jax.custom_vjp
def _flat_delta(x2: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """(x2 @ a) @ b for x2 [tokens, k], a [k, r], b [r, n]."""
    return (x2 @ a) @ b


def _flat_delta_fwd(x2, a, b):
    h = x2 @ a
    return h @ b, (x2, a, b, h)


def _flat_delta_bwd(residuals, g):
    x2, a, b, h = residuals
    gb = g @ b.T  # [tokens, r]
    return (gb @ a.T).astype(x2.dtype), (x2.T @ gb).astype(a.dtype), (h.T @ g).astype(b.dtype)


_flat_delta.defvjp(_flat_delta_fwd, _flat_delta_bwd)


def lora_delta(lhs: jax.Array, lora_a: jax.Array, lora_b: jax.Array, lhs_ca: Sequence[int], lhs_ba: Sequence[int],
               contract_shape: tuple, batch_shape: tuple, remain_shape: tuple, rank: int,
               precision=None) -> jax.Array:
    """Qwix's `_compute_lora_delta`, through `_flat_delta` where the lhs contracts its trailing axes in order."""
    trailing = tuple(range(lhs.ndim - len(contract_shape), lhs.ndim))
    if tuple(lhs_ba) or tuple(lhs_ca) != trailing or precision is not None:
        return _QWIX_DELTA(lhs, lora_a, lora_b, lhs_ca, lhs_ba, contract_shape, batch_shape, remain_shape, rank,
                           precision=precision)
    lead = lhs.shape[:lhs.ndim - len(contract_shape)]
    k, n = math.prod(contract_shape), math.prod(remain_shape)
    x2 = lhs.reshape(math.prod(lead), k)
    delta = _flat_delta(x2, lora_a.reshape(k, rank), lora_b.reshape(rank, n))
    return delta.reshape(*lead, *remain_shape)


def install() -> None:
    """Route Qwix's LoRA update through `lora_delta`; idempotent. A Qwix whose function changed is an error."""
    current = qwix_lora._compute_lora_delta
    if current is lora_delta:
        return
    params = tuple(inspect.signature(current).parameters)
    if params != _QWIX_PARAMS:
        raise RuntimeError(f"qwix._src.providers.lora._compute_lora_delta takes {params}, not {_QWIX_PARAMS}: "
                           "this Qwix is not the pinned one; pin it (requirements/learner.lock) or update "
                           "learner/lora_delta.py")
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
