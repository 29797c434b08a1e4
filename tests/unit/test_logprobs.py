"""The bounded-memory logprobs (learner/logprobs.py) against the dense reference and a NumPy model of vLLM.

- `keep_mask` (top-k by partial selection, top-p from the top-k candidates or by bisection) equals the dense
  full-sort mask exactly, on random logits and on logits with many ties;
- `window_logprobs` (LM head at completion positions only, in chunks) equals `dense_sampling_logprobs` within
  1e-6, values and gradients, for several sampling settings and chunk sizes, both ways of taking the gradient
  (fused: d logp / d hidden in the forward pass; plain autodiff of rematerialised chunks);
- with penalties and min_tokens (no dense reference) the fused gradient equals plain autodiff's;
- the chunks split the window evenly (no padded last chunk) within the asked size;
- with penalties and min_tokens it equals a NumPy transcription of vLLM's sampler (apply_penalties,
  MinTokensLogitsProcessor, then temperature / min-p / top-k / top-p), and without the modelling it does not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.batch import TrainBatch, pack
from learner.logprobs import balanced_chunks, keep_mask, window_logprobs
from learner.loss import _dense_keep_mask, dense_sampling_logprobs
from learner.sampling import SamplingTransform as ST

V, D = 64, 8
SAMPLINGS = [
    ST(), ST(temperature=0.7), ST(temperature=1.3, top_k=5), ST(temperature=0.9, top_p=0.8),
    ST(temperature=1.0, min_p=0.1), ST(temperature=0.8, top_k=12, top_p=0.9, min_p=0.02),
    ST(top_p=0.5), ST(top_k=1, top_p=0.3), ST(top_p=0.999),
]


@pytest.mark.parametrize("s", SAMPLINGS, ids=str)
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_keep_mask_equals_the_dense_sort(s, ties):
    logits = np.random.default_rng(3).normal(0, 2.0, (6, 7, V)).astype(np.float32)
    if ties:
        logits = np.round(logits)  # many equal values: the rule at ties must match too
    scaled = jnp.asarray(logits / np.float32(s.temperature))
    np.testing.assert_array_equal(keep_mask(scaled, s), _dense_keep_mask(scaled, s))


def random_batch(seed: int, sampling: ST, n: int = 5, first: list | None = None) -> TrainBatch:
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(0, V, rng.integers(1, 9))) for _ in range(n)]
    comps = [list(rng.integers(0, V, rng.integers(1, 13))) for _ in range(n)]
    comps[0] = comps[0] if first is None else first
    # The engine never samples a stop id before min_tokens.
    comps = [[3 if j < sampling.min_tokens and t in sampling.stop_token_ids else t for j, t in enumerate(c)]
             for c in comps]
    return TrainBatch(prompts, comps, [[0.0] * len(c) for c in comps], np.zeros(n), np.arange(n), sampling)


def head_and_hidden(seed: int, shape):
    rng = np.random.default_rng(seed)
    w = jnp.asarray(rng.normal(0, 1.0, (D, V)).astype(np.float32))
    hidden = jnp.asarray(rng.normal(0, 1.0, (*shape, D)).astype(np.float32))
    return (lambda h: h @ w), hidden


@pytest.mark.parametrize("s", SAMPLINGS[:6], ids=str)
@pytest.mark.parametrize("chunk", [5, 64])  # several chunks; one chunk wider than the window
@pytest.mark.parametrize("fused", [True, False], ids=["fused_grad", "autodiff"])
def test_window_logprobs_equal_the_dense_reference(s, chunk, fused):
    p = pack(random_batch(0, s), bucket=4, rows=6)
    head, hidden = head_and_hidden(1, p.tokens.shape)
    m = p.loss_mask > 0

    chunked = jax.jit(lambda h: window_logprobs(h, head, V, p, s, chunk, True, True, fused_grad=fused))

    logp, ent, raw = chunked(hidden)
    want, want_ent = dense_sampling_logprobs(head(hidden), jnp.asarray(p.targets), s, True)
    want_raw = dense_sampling_logprobs(head(hidden), jnp.asarray(p.targets), ST())[0]
    for got, ref in ((logp, want), (ent, want_ent), (raw, want_raw)):
        np.testing.assert_allclose(np.asarray(got)[m], np.asarray(ref)[m], atol=1e-6)
    assert not np.asarray(logp)[~m].any(), "positions outside the completion must be 0"
    g = jax.grad(lambda h: (chunked(h)[0] * p.loss_mask).sum())(hidden)
    g_ref = jax.grad(lambda h: (dense_sampling_logprobs(head(h), jnp.asarray(p.targets), s)[0] * p.loss_mask).sum())(
        hidden)
    np.testing.assert_allclose(g, g_ref, atol=1e-6)


# ---- penalties and min_tokens against vLLM's formulas ---------------------------------------------------------
def np_transform(z: np.ndarray, t: int, s: ST) -> float:
    """Temperature, min-p, top-k, top-p (dense sort), target kept, log-softmax; float64."""
    z = z.astype(np.float64) / s.temperature
    keep = np.isfinite(z)
    if s.min_p > 0:
        keep &= z >= z[keep].max() + np.log(s.min_p)
    if s.top_k > 0:
        keep &= z >= np.sort(z[keep])[::-1][min(s.top_k, keep.sum()) - 1]
    if s.top_p < 1:
        order = np.argsort(-np.where(keep, z, -np.inf), kind="stable")
        pr = np.where(keep, np.exp(z - z[keep].max()), 0.0)[order]
        pr /= pr.sum()
        before = np.cumsum(pr) - pr
        keep &= z >= z[order[max((before < s.top_p).sum(), 1) - 1]]
    keep[t] = True
    zk = np.where(keep, z, -np.inf)
    return float(z[t] - (np.log(np.exp(zk - zk.max()).sum()) + zk.max()))


def np_vllm_logprob(logits: np.ndarray, prompt: list, earlier: list, t: int, s: ST) -> float:
    """vLLM: min_tokens mask, repetition (prompt + output), frequency and presence (output only), then sample."""
    z = logits.astype(np.float32).copy()
    if len(earlier) < s.min_tokens:
        z[list(s.stop_token_ids)] = -np.inf
    counts = np.bincount(np.asarray(earlier, int), minlength=V).astype(np.float32)
    seen = (np.bincount(np.asarray(prompt, int), minlength=V) > 0) | (counts > 0)
    r = np.float32(s.repetition_penalty)
    z = np.where(seen, z * np.where(z > 0, np.float32(1) / r, r), z)
    z = z - np.float32(s.frequency_penalty) * counts - np.float32(s.presence_penalty) * (counts > 0)
    return np_transform(z, t, s)


PENALTIES = {
    "repetition": ST(repetition_penalty=1.3),
    "repetition<1": ST(temperature=0.8, repetition_penalty=0.7),
    "presence": ST(presence_penalty=0.8),
    "frequency": ST(frequency_penalty=0.5, top_k=20),
    "min_tokens": ST(min_tokens=6, stop_token_ids=(2, 5, 7)),
    "all": ST(temperature=0.9, top_p=0.9, min_p=0.01, repetition_penalty=1.2, presence_penalty=-0.4,
              frequency_penalty=0.3, min_tokens=3, stop_token_ids=(1,)),
}


@pytest.mark.parametrize("s", PENALTIES.values(), ids=PENALTIES.keys())
@pytest.mark.parametrize("chunk", [1, 5])
def test_penalties_and_min_tokens_follow_vllm(s, chunk):
    batch = random_batch(4, s, n=6, first=[3, 3, 3, 9, 3, 9, 9])  # repeats: every count rule is exercised
    p = pack(batch, bucket=4)
    head, hidden = head_and_hidden(5, p.tokens.shape)
    logits = np.asarray(head(hidden))
    run = lambda s: np.asarray(jax.jit(lambda h: window_logprobs(h, head, V, p, s, chunk, False, False)[0])(hidden))
    logp = run(s)
    plain = run(s._replace(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_tokens=0))
    gap = 0.0
    for i, (prompt, comp) in enumerate(zip(batch.prompt_ids, batch.completion_ids)):
        for j, t in enumerate(comp):
            pos = len(prompt) - 1 + j
            want = np_vllm_logprob(logits[i, pos], prompt, comp[:j], t, s)
            assert abs(logp[i, pos] - want) < 1e-5, (i, j, logp[i, pos], want)
            gap = max(gap, abs(plain[i, pos] - want))
    assert gap > 1e-2, f"the penalties change no logprob by more than {gap:.1e}: the test is vacuous"


# ---- the hidden-state forward + LM head split, per family, tied and untied -------------------------------------
TINY_HF = dict(num_hidden_layers=1, vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4)
FAMILIES = [("llama", True), ("llama", False), ("qwen2", True), ("qwen2", False), ("qwen3", False),
            ("gemma3_text", True)]


@pytest.mark.parametrize("model_type,tied", FAMILIES, ids=lambda x: str(x))
def test_hidden_forward_and_head_equal_the_model_logits(model_type, tied):
    import importlib

    from flax import nnx

    from learner.model import family_of, forward_hidden, forward_logits, tunix_config

    hf = {**TINY_HF, "model_type": model_type, "tie_word_embeddings": tied}
    family = family_of(hf)
    module = importlib.import_module(f"tunix.models.{family}.model")
    cls = {"llama3": "Llama3", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma3": "Gemma3"}[family]
    model = getattr(module, cls)(tunix_config(hf), rngs=nnx.Rngs(0))
    assert hasattr(model, "lm_head") != tied or family == "gemma3"
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 96, (2, 7)), jnp.int32)
    valid = jnp.ones(tokens.shape, bool).at[1, 5:].set(False)
    want = forward_logits(model, tokens, valid)
    graphdef, state = nnx.split(model)
    hidden, head = forward_hidden(nnx.merge(graphdef, state), tokens, valid)  # a copy: the head is switched off
    assert hidden.shape == (2, 7, 32)
    np.testing.assert_allclose(head(hidden), want, atol=1e-5)


@pytest.mark.parametrize("s", PENALTIES.values(), ids=PENALTIES.keys())
def test_fused_gradient_equals_autodiff_under_penalties(s):
    """The fused gradient rests on each position's logp depending on its own hidden state only; penalties and
    min_tokens make logits depend on earlier tokens (not on earlier hidden states), so it must still hold."""
    batch = random_batch(4, s, n=6, first=[3, 3, 3, 9, 3, 9, 9])
    p = pack(batch, bucket=4)
    head, hidden = head_and_hidden(5, p.tokens.shape)
    weights = jnp.asarray(np.random.default_rng(6).normal(size=p.tokens.shape).astype(np.float32)) * p.loss_mask
    loss = lambda fused: jax.jit(jax.value_and_grad(
        lambda h: (window_logprobs(h, head, V, p, s, 5, True, True, fused_grad=fused)[0] * weights).sum()))
    (v_fused, g_fused), (v_plain, g_plain) = loss(True)(hidden), loss(False)(hidden)
    assert float(v_fused) == float(v_plain), "the fused path must not change the value"
    assert np.abs(np.asarray(g_plain)).max() > 1e-3, "vacuous: no gradient to compare"
    # Measured: at most 1.7e-6 apart on gradients up to 7.3, a few float32 ulps.
    np.testing.assert_allclose(g_fused, g_plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("s", SAMPLINGS[:6] + [PENALTIES["all"]], ids=str)
@pytest.mark.parametrize("fused", [True, False], ids=["fused_grad", "autodiff"])
def test_entropy_gradient_equals_the_dense_reference(s, fused):
    """The entropy bonus (`learner.grpo.entropy_coef`) differentiates the entropy: the chunked path's gradient of a
    mix of logp and entropy equals autodiff of the dense reference (truncated tokens, -inf logits, add no NaN), and
    without `entropy_grad` the entropy stays detached. Fails before the entropy had a gradient (it was always
    detached, so the mix's gradient was logp's alone)."""
    p = pack(random_batch(7, s, n=5, first=[3, 3, 9, 3]), bucket=4, rows=6)
    head, hidden = head_and_hidden(8, p.tokens.shape)
    rng = np.random.default_rng(9)
    a, b = (jnp.asarray(rng.normal(size=p.tokens.shape).astype(np.float32)) * p.loss_mask for _ in range(2))
    mix = lambda logp, ent: (logp * a + ent * b).sum()
    chunked = lambda grad: jax.jit(jax.value_and_grad(lambda h: mix(*window_logprobs(
        h, head, V, p, s, 5, True, False, fused_grad=fused, entropy_grad=grad)[:2])))
    value, g = chunked(True)(hidden)
    assert np.isfinite(np.asarray(g)).all(), "a truncated token's -inf logit leaked into the gradient"
    if not s.needs_history:  # the dense reference models no penalties
        targets = jnp.asarray(p.targets)
        want, g_want = jax.value_and_grad(lambda h: mix(*dense_sampling_logprobs(head(h), targets, s, True, True)))(
            hidden)
        np.testing.assert_allclose(value, want, rtol=1e-5)
        np.testing.assert_allclose(g, g_want, atol=1e-5)
    else:  # against plain autodiff of the rematerialised chunks
        g_plain = jax.grad(lambda h: mix(*window_logprobs(h, head, V, p, s, 5, True, False, entropy_grad=True)[:2]))(
            hidden)
        np.testing.assert_allclose(g, g_plain, rtol=1e-5, atol=1e-5)
    _, g_detached = chunked(False)(hidden)
    g_logp = jax.grad(lambda h: (window_logprobs(h, head, V, p, s, 5, True, False, fused_grad=fused)[0] * a).sum())(
        hidden)
    np.testing.assert_allclose(g_detached, g_logp, atol=1e-6)
    assert np.abs(np.asarray(g) - np.asarray(g_detached)).max() > 1e-3, "vacuous: the entropy adds no gradient"


@pytest.mark.parametrize("width,chunk,want", [(192, 128, (2, 96)), (1024, 128, (8, 128)), (96, 128, (1, 96)),
                                              (12, 5, (3, 4)), (200, 64, (4, 56)), (130, 128, (2, 72))])
def test_chunks_are_balanced_and_never_larger_than_asked(width, chunk, want):
    """The head runs at n x c positions: as few over the window as n chunks allow, each chunk within the memory
    bound `chunk` (a multiple of 8 where that fits, for the matmul's row tiles)."""
    n, c = balanced_chunks(width, chunk)
    assert (n, c) == want
    assert c <= chunk and n * c >= width and n == -(-width // chunk)
