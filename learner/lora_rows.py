"""Per-row LoRA: several adapters in one pass, each row of the batch through its own (several tenants' requests).

In a pass of several adapters (learner/tenant_stack.py) every LoRA leaf holds the adapters stacked: A [T, k, R],
B [T, R, n], each adapter's rank zero-padded to the pass's R. Row b of the batch uses adapter `rows[b]`, scaled by
`scale[b]` (its alpha / rank):

    delta[b] = scale[b] * (x[b] @ A[rows[b]]) @ B[rows[b]]

The backward sums each adapter's weight gradient over its own rows only (a segment sum), so adapter t's gradient
is the one its rows alone would give; a padded column of A meets a zero row of B, so both get zero gradient.

Qwix computes the LoRA update with the leaf values it finds on the module, so the stacked leaves reach it as they
are; which adapter each row uses cannot travel that way, so the pass sets it around the model call (`rows_use`)
and the update reads it while tracing. Two of Qwix's paths meet stacked leaves: a Linear's update
(`learner/lora_delta.py` routes a 3-D A to `delta_rows`) and an Einsum's (Tunix's attention projections:
`einsum`, installed in place of `LoraProvider.einsum`, which adds the row axis to Qwix's LoRA einsum string).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from qwix._src.providers import lora as qwix_lora
from qwix._src.providers import ptq
from qwix._src.utils import flax_util

from common.pins import PINS, require_pinned


class RowAdapters(NamedTuple):
    """Which stacked adapter each row of the current model call uses, and each adapter's scale (traced arrays)."""

    index: jax.Array  # int32 [B]
    slot_scale: jax.Array  # float32 [T]: each stacked adapter's alpha / rank

    @property
    def scale(self) -> jax.Array:
        """[B]: each row's adapter's scale."""
        return self.slot_scale[self.index]


_CURRENT: contextvars.ContextVar[RowAdapters | None] = contextvars.ContextVar("lora_rows", default=None)


@contextlib.contextmanager
def rows_use(rows: RowAdapters) -> Iterator[None]:
    """Trace the model calls inside this block with per-row adapters (the LoRA leaves stacked [T, ...])."""
    token = _CURRENT.set(rows)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> RowAdapters:
    rows = _CURRENT.get()
    if rows is None:
        raise RuntimeError("stacked LoRA leaves (3-D) met outside a tenant pass: trace the model inside rows_use()")
    return rows


@jax.custom_vjp
def delta_rows(x: jax.Array, a: jax.Array, b: jax.Array, index: jax.Array, scale: jax.Array) -> jax.Array:
    """scale[r] * (x[r] @ a[index[r]]) @ b[index[r]] for x [B, ..., k], a [T, k, R], b [T, R, n]."""
    return _forward(x, a, b, index, scale)[0]


def _forward(x, a, b, index, scale):
    a_rows, b_rows = a[index], b[index]  # [B, k, R], [B, R, n]
    h = jnp.einsum("b...k,bkr->b...r", x, a_rows)
    out = jnp.einsum("b...r,brn->b...n", h, b_rows)
    return out * _per_row(scale, out), (a_rows, b_rows, h)


def _per_row(scale: jax.Array, like: jax.Array) -> jax.Array:
    return scale.astype(like.dtype).reshape((-1,) + (1,) * (like.ndim - 1))


def _fwd(x, a, b, index, scale):
    out, (a_rows, b_rows, h) = _forward(x, a, b, index, scale)
    return out, (x, a_rows, b_rows, h, index, scale, a.shape[0])


def _bwd(residuals, g):
    x, a_rows, b_rows, h, index, scale, adapters = residuals
    g = g * _per_row(scale, g)
    gh = jnp.einsum("b...n,brn->b...r", g, b_rows)  # [B, ..., R]
    gx = jnp.einsum("b...r,bkr->b...k", gh, a_rows).astype(x.dtype)
    ga_rows = jnp.einsum("b...k,b...r->bkr", x, gh)
    gb_rows = jnp.einsum("b...r,b...n->brn", h, g)
    ga = jax.ops.segment_sum(ga_rows, index, adapters).astype(a_rows.dtype)
    gb = jax.ops.segment_sum(gb_rows, index, adapters).astype(b_rows.dtype)
    zero_index = np.zeros(index.shape, jax.dtypes.float0)
    return gx, ga, gb, zero_index, jnp.zeros_like(scale)


delta_rows.defvjp(_fwd, _bwd)


_QWIX_EINSUM = qwix_lora.LoraProvider.einsum
_QWIX_EINSUM_PARAMS = ("self", "einsum_str", "operands", "kwargs")


def einsum(self, einsum_str: str, *operands, **kwargs):
    """Qwix's `LoraProvider.einsum`; inside a tenant pass (`rows_use`), with each row's adapter gathered from the
    stacked leaves: Qwix's LoRA string "BTD,Dr,rNH->BTNH" becomes "BTD,BDr,BrNH->BTNH" (the lhs's first axis is
    the row), scaled per row. Outside one, Qwix's own."""
    rows = _CURRENT.get()
    if rows is None:
        return _QWIX_EINSUM(self, einsum_str, *operands, **kwargs)
    res = ptq.PtqProvider.einsum(self, einsum_str, *operands, **kwargs)
    rule, _ = self._get_current_rule_and_op_id("einsum", repeated_call=True)
    if not isinstance(rule, qwix_lora.LoraRule):
        return res
    lhs, rhs = operands
    weight_name = flax_util.find_param(rhs, ptq.WithAux)
    if weight_name is None:
        return res
    _, _, lora_str, _, _ = qwix_lora._parse_einsum_str_for_lora(lhs.shape, rhs.shape, einsum_str, rule.rank)
    module = flax_util.get_current_module()
    a = flax_util.unbox(getattr(module, weight_name + "_lora_a"))
    b = flax_util.unbox(getattr(module, weight_name + "_lora_b"))
    inputs, out = lora_str.split("->")
    lhs_str, a_str, b_str = inputs.split(",")
    row = lhs_str[0]
    delta = jnp.einsum(f"{lhs_str},{row}{a_str},{row}{b_str}->{out}", lhs, a[rows.index], b[rows.index], **kwargs)
    # The row axis need not lead the output (Gemma 3's fused k/v einsum puts k-or-v first).
    scale = rows.scale.astype(delta.dtype).reshape([-1 if c == row else 1 for c in out])
    return res + delta * scale * (rule.alpha / rule.rank)


def install() -> None:
    """Put `einsum` in place of Qwix's `LoraProvider.einsum`; idempotent. Another Qwix is an error."""
    require_pinned("qwix", "learner/lora_rows.py")
    if qwix_lora.LoraProvider.einsum is einsum:
        return
    params = tuple(inspect.signature(_QWIX_EINSUM).parameters)
    if params != _QWIX_EINSUM_PARAMS:
        raise RuntimeError(f"qwix LoraProvider.einsum takes {params}, not {_QWIX_EINSUM_PARAMS}: this Qwix is not the "
                           f"pinned one; pin it (qwix=={PINS['qwix']}) or update learner/lora_rows.py")
    qwix_lora.LoraProvider.einsum = einsum
