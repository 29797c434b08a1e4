"""learner/lora_delta.py: the LoRA update with a hand-written backward equals Qwix's own function and its autodiff
gradients, and its compiled backward has no transposed copy of a [tokens, features] activation (the reason it
exists: XLA:CPU made one per LoRA projection of the MLP)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from qwix._src.providers import lora as qwix_lora

from learner import lora_delta

RANK = 4


def _args(lhs_shape, contract_shape, remain_shape, dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    lhs = jax.random.normal(k[0], lhs_shape, jnp.float32).astype(dtype)
    a = jax.random.normal(k[1], (*contract_shape, RANK), jnp.float32) * 0.3
    b = jax.random.normal(k[2], (RANK, *remain_shape), jnp.float32) * 0.3
    return lhs, a, b


def _delta(fn, contract_axes, contract_shape, remain_shape):
    return lambda lhs, a, b: fn(lhs, a, b, contract_axes, (), contract_shape, (), remain_shape, RANK)


# (lhs shape, contracting axes, contract shape, remain shape): a Linear on [batch, time, dim], on 2-D and on 4-D
# activations. The layouts that go to Qwix's own function are in test_other_layouts_go_to_qwix_unchanged.
LAYOUTS = [((2, 5, 6), (2,), (6,), (7,)), ((3, 6), (1,), (6,), (5,)), ((2, 3, 4, 6), (3,), (6,), (7,))]


@pytest.mark.parametrize("lhs_shape,axes,contract,remain", LAYOUTS)
def test_values_and_gradients_equal_qwix_autodiff(lhs_shape, axes, contract, remain):
    lhs, a, b = _args(lhs_shape, contract, remain)
    ours = _delta(lora_delta.lora_delta, axes, contract, remain)
    stock = _delta(lora_delta._QWIX_DELTA, axes, contract, remain)
    np.testing.assert_allclose(ours(lhs, a, b), stock(lhs, a, b), rtol=1e-6, atol=1e-6)
    weights = jax.random.normal(jax.random.key(9), ours(lhs, a, b).shape)
    grads = [jax.grad(lambda *x, f=f: jnp.sum(f(*x) * weights), argnums=(0, 1, 2))(lhs, a, b) for f in (ours, stock)]
    for got, want, name in zip(*grads, ("d lhs", "d A", "d B")):
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_bfloat16_activations_keep_their_dtypes():
    lhs, a, b = _args((2, 5, 6), (6,), (7,), dtype=jnp.bfloat16)
    ours = _delta(lora_delta.lora_delta, (2,), (6,), (7,))
    stock = _delta(lora_delta._QWIX_DELTA, (2,), (6,), (7,))
    assert ours(lhs, a, b).dtype == stock(lhs, a, b).dtype
    loss = lambda f: lambda *x: jnp.sum(f(*x).astype(jnp.float32))
    got = jax.grad(loss(ours), argnums=(0, 1, 2))(lhs, a, b)
    want = jax.grad(loss(stock), argnums=(0, 1, 2))(lhs, a, b)
    assert [g.dtype for g in got] == [w.dtype for w in want] == [jnp.bfloat16, jnp.float32, jnp.float32]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.float32(g), np.float32(w), rtol=2e-2, atol=2e-2)


# A middle axis contracted, two axes contracted, two output axes.
@pytest.mark.parametrize("lhs_shape,axes,contract,remain", [((3, 6, 2), (1,), (6,), (5,)),
                                                           ((2, 5, 3, 4), (2, 3), (3, 4), (6,)),
                                                           ((3, 6), (1,), (6,), (2, 5))])
def test_other_layouts_go_to_qwix_unchanged(lhs_shape, axes, contract, remain, monkeypatch):
    lhs, a, b = _args(lhs_shape, contract, remain)
    monkeypatch.setattr(lora_delta, "_delta", None)  # the fast path would fail: these must not reach it
    args = (axes, (), contract, (), remain, RANK)
    np.testing.assert_array_equal(lora_delta.lora_delta(lhs, a, b, *args), lora_delta._QWIX_DELTA(lhs, a, b, *args))


def _mlp_grad_hlo(delta_fn) -> str:
    """Compiled HLO of the LoRA gradient through a SwiGLU MLP whose three projections carry LoRA (as Tunix's)."""
    tokens, d, f = (4, 64), 48, 128
    k = iter(jax.random.split(jax.random.key(1), 10))
    x = jax.random.normal(next(k), (*tokens, d))
    w = {n: jax.random.normal(next(k), s) for n, s in (("gate", (d, f)), ("up", (d, f)), ("down", (f, d)))}
    lora = {n: (jnp.zeros((s[0], RANK)) + 0.1, jnp.zeros((RANK, s[1])) + 0.1) for n, s in
            (("gate", (d, f)), ("up", (d, f)), ("down", (f, d)))}

    def proj(name, h, lora):
        a, b = lora[name]
        return h @ w[name] + delta_fn(h, a, b, (2,), (), a.shape[:1], (), b.shape[1:], RANK) * 2.0

    def loss(lora):
        h = jax.nn.silu(proj("gate", x, lora)) * proj("up", x, lora)
        return jnp.sum(proj("down", h, lora))

    return jax.jit(jax.grad(loss)).lower(lora).compile().as_text()


def _big_transposes(hlo: str) -> list[str]:
    """Transposes (and the copies XLA makes of them) of arrays of at least tokens x intermediate elements."""
    return [line.strip()[:120] for line in hlo.splitlines()
            if re.search(r"= f32\[[\d,]+\]\S* (transpose|copy)\(", line)
            and np.prod([int(n) for n in re.search(r"f32\[([\d,]+)\]", line).group(1).split(",")]) >= 256 * 128]


def test_the_backward_makes_no_transposed_copy_of_activations():
    assert _big_transposes(_mlp_grad_hlo(lora_delta.lora_delta)) == []
    # What it replaces: if this fails, XLA no longer transposes Qwix's gradient and lora_delta may be retired.
    assert _big_transposes(_mlp_grad_hlo(lora_delta._QWIX_DELTA)), "Qwix's autodiff backward lost its transposes"


def test_install_routes_qwix_and_stock_qwix_restores_it():
    lora_delta.install()
    lora_delta.install()  # idempotent
    assert qwix_lora._compute_lora_delta is lora_delta.lora_delta
    with lora_delta.stock_qwix():
        assert qwix_lora._compute_lora_delta is lora_delta._QWIX_DELTA
    assert qwix_lora._compute_lora_delta is lora_delta.lora_delta


def test_a_changed_qwix_function_is_one_line_naming_the_pin(monkeypatch):
    monkeypatch.setattr(qwix_lora, "_compute_lora_delta", lambda lhs, lora_a, lora_b, rank: None)
    with pytest.raises(RuntimeError, match=r"not the pinned one; pin it .*learner/lora_delta.py"):
        lora_delta.install()
