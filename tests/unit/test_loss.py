"""GRPO loss pieces against NumPy references written from the formulas, and against Tunix's own GRPO loss.

Hand-made groups, ragged completions, every aggregation mode and KL estimator, clip-higher, truncated IS.
The Tunix cross-check runs `tunix.rl.algo_core.grpo_loss_fn` on a tiny real stand-in model (a bigram table,
`BigramLM`) and compares loss and gradient with ours on the same inputs where the options coincide
(no top-k/top-p: Tunix has no truncation).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.batch import TrainBatch, pack
from learner.loss import LossOptions, dense_sampling_logprobs, grpo_token_loss, kl_penalty, token_weights
from learner.sampling import SamplingTransform
from orchestration.update import constant_reward_groups, group_advantages

TOL = 1e-5


# ---- advantages ---------------------------------------------------------------------------------------------
def test_advantages_hand_computed_groups():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 2.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    # group 0: mean 0.5, std(ddof=1) = sqrt(1/3); group 1: mean 0.875, std(ddof=1) = 0.75
    s0, s1 = np.sqrt(1 / 3), 0.75
    want = np.array([0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0, -0.375 / s1, -0.375 / s1, -0.375 / s1, 1.125 / s1])
    np.testing.assert_allclose(group_advantages(rewards, groups, std_normalize=True), want, atol=1e-5)
    dr = group_advantages(rewards, groups, std_normalize=False)
    np.testing.assert_allclose(dr, [0.5, -0.5, -0.5, 0.5, -0.375, -0.375, -0.375, 1.125], atol=1e-7)


def test_advantages_constant_group_is_zero_and_groups_may_interleave():
    adv = group_advantages(np.array([3.0, 1.0, 3.0, 2.0]), np.array([7, 9, 7, 9]), std_normalize=True)
    assert adv[0] == 0 and adv[2] == 0, "a group with equal rewards must get zero advantage"
    assert adv[1] < 0 < adv[3]


def test_advantages_match_tunix():
    from tunix.rl.algo_core import compute_advantages

    rewards = np.random.default_rng(0).random(12).astype(np.float32)
    ours = group_advantages(rewards, np.repeat(np.arange(3), 4), std_normalize=True)
    np.testing.assert_allclose(ours, compute_advantages(rewards, 4), atol=1e-5)


# ---- sampling transform -------------------------------------------------------------------------------------
def np_sampling_logprobs(logits, targets, s: SamplingTransform):
    """Reference: tempered logits, min-p, top-k, top-p (vLLM's order), target kept, renormalised."""
    z = logits.astype(np.float64) / s.temperature
    out = np.zeros(targets.shape)
    grad = np.zeros(logits.shape)
    for idx in np.ndindex(targets.shape):
        row, t = z[idx], targets[idx]
        keep = np.ones(row.shape, bool)
        if s.min_p > 0:
            p = np.exp(row - row.max())
            keep &= p >= s.min_p * p.max()
        if s.top_k > 0:
            keep &= row >= np.sort(row[keep])[::-1][min(s.top_k, keep.sum()) - 1]
        if s.top_p < 1:
            order = np.argsort(-np.where(keep, row, -np.inf))
            p = np.where(keep, np.exp(row - row.max()), 0.0)
            p = p[order] / p.sum()
            before = np.cumsum(p) - p
            kept = order[: max((before < s.top_p).sum(), 1)]
            mask = np.zeros_like(keep)
            mask[kept] = True
            keep &= mask
        keep[t] = True
        zk = np.where(keep, row, -np.inf)
        lse = np.log(np.exp(zk - zk.max()).sum()) + zk.max()
        out[idx] = row[t] - lse
        soft = np.where(keep, np.exp(zk - lse), 0.0)
        grad[idx] = (np.eye(len(row))[t] - soft) / s.temperature
    return out, grad


SAMPLINGS = [
    SamplingTransform(),
    SamplingTransform(temperature=0.7),
    SamplingTransform(temperature=1.3, top_k=5),
    SamplingTransform(temperature=0.9, top_p=0.8),
    SamplingTransform(temperature=1.0, min_p=0.1),
    SamplingTransform(temperature=0.8, top_k=12, top_p=0.9, min_p=0.02),
]


@pytest.mark.parametrize("s", SAMPLINGS, ids=str)
def test_sampling_logprobs_and_gradient_match_numpy(s):
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2.0, (3, 4, 40)).astype(np.float32)
    targets = rng.integers(0, 40, (3, 4))
    targets[0, 0] = int(np.argmin(logits[0, 0]))  # outside every truncation: must stay finite
    want, want_grad = np_sampling_logprobs(logits, targets, s)
    got = dense_sampling_logprobs(jnp.asarray(logits), jnp.asarray(targets), s)[0]
    assert np.isfinite(np.asarray(got)).all(), "sampled token outside the truncated set gave -inf"
    np.testing.assert_allclose(got, want, atol=TOL)
    grad = jax.grad(lambda x: dense_sampling_logprobs(x, jnp.asarray(targets), s)[0].sum())(jnp.asarray(logits))
    np.testing.assert_allclose(grad, want_grad, atol=TOL)


def test_sampling_entropy_of_untruncated_distribution():
    logits = np.random.default_rng(2).normal(size=(2, 3, 16)).astype(np.float32)
    _, ent = dense_sampling_logprobs(jnp.asarray(logits), jnp.zeros((2, 3), jnp.int32), SamplingTransform(), with_entropy=True)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(ent, -(p * np.log(p)).sum(-1), atol=TOL)


# ---- the loss -----------------------------------------------------------------------------------------------
def make_groups(seed=0, lengths=(3, 5, 1, 4, 6, 2)):
    """Two groups of three ragged completions, per-token arrays [B, L] with a mask."""
    rng = np.random.default_rng(seed)
    b, length = len(lengths), max(lengths) + 1
    mask = np.zeros((b, length), np.float32)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logp = -rng.random((b, length)).astype(np.float32) * 2 - 0.1
    old = logp + rng.normal(0, 0.3, (b, length)).astype(np.float32)  # ratios inside and outside the clip range
    engine = old + rng.normal(0, 0.5, (b, length)).astype(np.float32)
    ref = logp + rng.normal(0, 0.2, (b, length)).astype(np.float32)
    adv = group_advantages(rng.random(b), np.repeat([0, 1], 3), std_normalize=True)
    return dict(logp=logp, old=old, engine=engine, ref=ref, adv=adv, mask=mask)


def np_loss_and_grad(g, weights, o: LossOptions):
    """Reference per-token GRPO loss and d loss / d logp, straight from the formulas (float64)."""
    logp, old = g["logp"].astype(np.float64), g["old"].astype(np.float64)
    a = g["adv"][:, None].astype(np.float64)
    r = np.exp(logp - old)
    pg1, pg2 = -a * r, -a * np.clip(r, 1 - o.clip_eps_low, 1 + o.clip_eps_high)
    pg = np.maximum(pg1, pg2)
    dpg = np.where(pg1 >= pg2, -a * r, 0.0)
    is_w = np.exp(old - g["engine"])
    if o.is_cap is not None:
        is_w = np.minimum(is_w, o.is_cap)
    d = logp - g["ref"]
    kl, dkl = {"k1": (d, np.ones_like(d)), "k2": (0.5 * d**2, d),
               "k3": (np.exp(-d) + d - 1, 1 - np.exp(-d))}[o.kl_estimator]
    per_token = is_w * pg + o.kl_beta * kl
    return (weights * per_token).sum(), weights * (is_w * dpg + o.kl_beta * dkl)


def np_weights(mask, mode, norm):
    lengths = mask.sum(-1)
    if mode == "token-mean":
        return mask / mask.sum()
    if mode == "seq-mean-token-mean":
        return mask / lengths[:, None] / len(mask)
    return mask / norm / len(mask)


OPTIONS = [
    LossOptions(0.2, 0.2, 0.0, "k3", None),
    LossOptions(0.2, 0.28, 0.05, "k1", 2.0),
    LossOptions(0.1, 0.3, 0.1, "k2", 1.5),
    LossOptions(0.2, 0.28, 0.04, "k3", 1.2),
]
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("opts,mode", list(itertools.product(OPTIONS, MODES)), ids=str)
def test_loss_and_gradient_match_numpy(opts, mode):
    g = make_groups()
    weights = token_weights(g["mask"], mode, norm_tokens=16)
    np.testing.assert_allclose(weights, np_weights(g["mask"], mode, 16), atol=1e-7)
    want, want_grad = np_loss_and_grad(g, weights, opts)

    def f(logp):
        j = {k: jnp.asarray(v) for k, v in g.items()}
        return grpo_token_loss(logp, j["old"], j["old"], j["engine"], j["adv"], jnp.asarray(weights), j["mask"],
                               opts, j["ref"])

    (loss, sums), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(g["logp"]))
    np.testing.assert_allclose(loss, want, atol=TOL)
    np.testing.assert_allclose(grad, want_grad, atol=TOL)
    m = g["mask"]
    is_ratio = np.exp(g["old"] - g["engine"])
    np.testing.assert_allclose(sums["logprob_abs_diff"], (m * np.abs(g["old"] - g["engine"])).sum(), rtol=1e-5)
    np.testing.assert_allclose(sums["is_ratio"], (m * is_ratio).sum(), rtol=1e-5)
    np.testing.assert_allclose(sums["mismatch_kl"], (m * (is_ratio - 1 - np.log(is_ratio))).sum(), rtol=1e-4)


def test_on_policy_ratio_is_one_and_nothing_clips():
    g = make_groups(seed=3)
    j = {k: jnp.asarray(v) for k, v in g.items()}
    _, sums = grpo_token_loss(j["logp"], j["logp"], j["logp"], j["logp"], j["adv"], j["mask"], j["mask"],
                              LossOptions())
    assert float(sums["clip"]) == 0 and float(sums["is_clip"]) == 0
    np.testing.assert_allclose(sums["is_ratio"], sums["tokens"], rtol=1e-6)


def test_the_entropy_bonus_subtracts_its_weighted_entropy_and_raises_a_collapsed_distribution():
    """`entropy_coef` (learner.grpo.entropy_coef): the loss is the GRPO loss minus coef x the weighted entropy, its
    gradient with respect to the entropy -coef x the token weights; a missing entropy is refused. On a softmax
    that has collapsed onto one token, with zero advantages (no group varied), a few steps of the bonus alone raise
    the entropy. Fails before the bonus existed."""
    g = make_groups(seed=5)
    j = {k: jnp.asarray(v) for k, v in g.items()}
    w = token_weights(g["mask"], "token-mean", 8)
    ent = jnp.asarray(np.random.default_rng(6).random(g["mask"].shape).astype(np.float32))
    base = grpo_token_loss(j["logp"], j["old"], j["old"], j["engine"], j["adv"], w, j["mask"], LossOptions())[0]
    opts = LossOptions(entropy_coef=0.01)
    loss, d_ent = jax.value_and_grad(lambda e: grpo_token_loss(
        j["logp"], j["old"], j["old"], j["engine"], j["adv"], w, j["mask"], opts, entropy=e)[0])(ent)
    np.testing.assert_allclose(loss, base - 0.01 * float((w * ent).sum()), rtol=1e-6)
    np.testing.assert_allclose(d_ent, -0.01 * w, rtol=1e-6)
    with pytest.raises(ValueError, match="entropy_coef > 0 needs the entropy"):
        grpo_token_loss(j["logp"], j["old"], j["old"], j["engine"], j["adv"], w, j["mask"], opts)

    logits = jnp.asarray(np.r_[8.0, np.zeros(15)].astype(np.float32))[None, None]  # [1, 1, V]: one token at ~0.996
    target, one, zero = jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1)), jnp.zeros(1)

    def loss_of(z):
        logp, e = dense_sampling_logprobs(z, target, SamplingTransform(), True, True)
        return grpo_token_loss(logp, logp, logp, logp, zero, one, one, opts, entropy=e)[0]

    entropy = lambda z: float(dense_sampling_logprobs(z, target, SamplingTransform(), True)[1][0, 0])
    before, z = entropy(logits), logits
    for _ in range(20):
        z = z - 1000.0 * jax.grad(loss_of)(z)
    assert entropy(z) > before + 0.1, f"the bonus alone should spread a collapsed distribution: {before} -> {entropy(z)}"


def test_gradient_accumulation_equals_full_batch():
    """Weights computed over the mini-batch make micro-batch losses add up to the mini-batch loss."""
    g = make_groups(seed=4)
    opts = LossOptions(kl_beta=0.1)
    for mode in MODES:
        w = token_weights(g["mask"], mode, 8)
        j = {k: jnp.asarray(v) for k, v in g.items()}
        full = grpo_token_loss(j["logp"], j["old"], j["old"], j["engine"], j["adv"], w, j["mask"], opts, j["ref"])[0]
        parts = sum(
            grpo_token_loss(j["logp"][s], j["old"][s], j["old"][s], j["engine"][s], j["adv"][s], w[s], j["mask"][s],
                            opts, j["ref"][s])[0]
            for s in (slice(0, 2), slice(2, 6))
        )
        np.testing.assert_allclose(parts, full, atol=TOL, err_msg=mode)


# ---- agreement with Tunix -----------------------------------------------------------------------------------
class BigramLM(nnx.Module):
    """Tiny real stand-in LM for the Tunix cross-check: logits depend only on the current token."""

    def __init__(self, vocab: int, seed: int):
        self.table = nnx.Param(jax.random.normal(jax.random.key(seed), (vocab, vocab)))

    def __call__(self, tokens, positions=None, cache=None, attention_mask=None):
        return self.table[tokens], None


TUNIX_MODES = {"token-mean": "token-mean", "seq-mean-token-mean": "sequence-mean-token-mean",
               "seq-mean-token-sum-norm": "sequence-mean-token-sum-norm"}
TUNIX_KL = {"k1": "kl", "k2": "mse_kl", "k3": "low_var_kl"}


@pytest.mark.parametrize("opts,mode", [(OPTIONS[0], "token-mean"), (OPTIONS[1], "seq-mean-token-mean"),
                                       (OPTIONS[2], "seq-mean-token-sum-norm"), (OPTIONS[3], "token-mean")], ids=str)
def test_loss_and_gradient_match_tunix(opts, mode):
    from tunix.rl import algo_core, common
    from tunix.rl.grpo.grpo_learner import GRPOConfig

    vocab, pad, temperature, norm_tokens = 32, 0, 0.8, 7
    rng = np.random.default_rng(5)
    lengths = [4, 2, 6, 5]
    prompts = [list(rng.integers(1, vocab, 3)) for _ in lengths]
    completions = [list(rng.integers(1, vocab, n)) for n in lengths]
    model = BigramLM(vocab, seed=0)
    table = np.asarray(model.table[...])
    # Engine and reference logprobs: the model's own, perturbed (a different sampler / a moved policy).
    scaled = table / temperature
    own = [[scaled[s][t] - np.log(np.exp(scaled[s]).sum()) for s, t in zip([p[-1]] + c[:-1], c)]
           for p, c in zip(prompts, completions)]
    engine = [list(np.asarray(o) + rng.normal(0, 0.3, len(o))) for o in own]
    ref = [list(np.asarray(o) + rng.normal(0, 0.2, len(o))) for o in own]
    adv = np.array([1.0, -0.5, 0.7, -1.2], np.float32)

    # Tunix: completions right-padded with pad_id; its TIS weights are given precomputed.
    c_len = max(lengths)
    comp = np.full((4, c_len), pad, np.int32)
    cmask = np.zeros((4, c_len), np.float32)
    eng, refp = np.zeros((4, c_len), np.float32), np.zeros((4, c_len), np.float32)
    for i, (c, e, r) in enumerate(zip(completions, engine, ref)):
        comp[i, : len(c)], cmask[i, : len(c)], eng[i, : len(c)], refp[i, : len(c)] = c, 1, e, r
    own_pad = np.zeros((4, c_len), np.float32)
    for i, o in enumerate(own):
        own_pad[i, : len(o)] = o
    is_w = np.exp(own_pad - eng)
    is_w = np.minimum(is_w, opts.is_cap) if opts.is_cap is not None else is_w
    algo = GRPOConfig(num_generations=2, beta=opts.kl_beta, epsilon=opts.clip_eps_low,
                      loss_agg_mode=TUNIX_MODES[mode], kl_loss_mode=TUNIX_KL[opts.kl_estimator])
    algo.epsilon_high, algo.temperature = opts.clip_eps_high, temperature
    example = common.TrainExample(
        prompt_ids=jnp.asarray(prompts, jnp.int32), prompt_mask=jnp.ones((4, 3), jnp.int32),
        completion_ids=jnp.asarray(comp), completion_mask=jnp.asarray(cmask), advantages=jnp.asarray(adv),
        ref_per_token_logps=jnp.asarray(refp), old_per_token_logps=None, sampler_is_weights=jnp.asarray(is_w))
    if mode == "seq-mean-token-sum-norm":  # Tunix's norm defaults to #rows; Dr. GRPO's constant is rows * budget
        real = common.aggregate_loss
        common.aggregate_loss = lambda *a, **k: real(*a, **k, norm=4 * norm_tokens)
    try:
        def tunix_loss(m):
            return algo_core.grpo_loss_fn(m, example, algo, pad, 2)[0]
        t_loss, t_grad = nnx.value_and_grad(tunix_loss)(model)
    finally:
        if mode == "seq-mean-token-sum-norm":
            common.aggregate_loss = real

    batch = TrainBatch(prompts, completions, engine, adv, np.arange(4), SamplingTransform(temperature))
    p = pack(batch, bucket=4)
    w = token_weights(p.loss_mask, mode, norm_tokens)

    def our_loss(tab):
        logp = dense_sampling_logprobs(tab[p.tokens], jnp.asarray(p.targets), SamplingTransform(temperature))[0]
        old = jax.lax.stop_gradient(logp)
        ref_full = np.zeros_like(p.engine_logprobs)
        for i, r in enumerate(ref):
            ref_full[i, 2 : 2 + len(r)] = r
        return grpo_token_loss(logp, old, old, jnp.asarray(p.engine_logprobs), jnp.asarray(p.advantages),
                               jnp.asarray(w), jnp.asarray(p.loss_mask), opts, jnp.asarray(ref_full))[0]

    o_loss, o_grad = jax.value_and_grad(our_loss)(jnp.asarray(table))
    np.testing.assert_allclose(o_loss, t_loss, atol=TOL, err_msg="loss differs from Tunix's grpo_loss_fn")
    np.testing.assert_allclose(o_grad, t_grad.table[...], atol=TOL, err_msg="gradient differs from Tunix's")


# ---- what each KL estimator's gradient is, in the loss ----------------------------------------------------------
def test_kl_estimator_gradients_in_the_loss():
    """Exact expectations over a small vocabulary, samples y ~ pi_theta held fixed (gradient through logp only):
    E[grad k1] = 0, E[grad k2] = grad KL(pi || ref), E[grad k3] = grad KL(ref || pi).

    Derivation, d = log pi(y) - log ref(y), g = grad log pi(y), E = sum_y pi(y):
    k1 = d -> g, E[g] = sum_y grad pi(y) = 0; k2 = d^2/2 -> d g, and grad KL(pi||ref) = E[d g] + E[g] = E[d g];
    k3 = e^-d + d - 1 -> (1 - ref/pi) g, E = E[g] - sum_y ref(y) g(y) = -E_ref[g] = grad KL(ref||pi).
    """
    rng = np.random.default_rng(7)
    theta, ref = jnp.asarray(rng.normal(size=9)), jax.nn.log_softmax(jnp.asarray(rng.normal(size=9)))
    pi = jax.nn.softmax(theta)
    ys = jnp.arange(9)

    def expected_grad(estimator):
        per_y = jax.vmap(lambda y: jax.grad(lambda t: kl_penalty(jax.nn.log_softmax(t)[y], ref[y], estimator))(theta))
        return (pi[:, None] * per_y(ys)).sum(0)

    reverse = jax.grad(lambda t: jnp.sum(jax.nn.softmax(t) * (jax.nn.log_softmax(t) - ref)))(theta)
    forward = jax.grad(lambda t: jnp.sum(jnp.exp(ref) * (ref - jax.nn.log_softmax(t))))(theta)
    np.testing.assert_allclose(expected_grad("k1"), 0.0, atol=1e-6)
    np.testing.assert_allclose(expected_grad("k2"), reverse, atol=1e-6)
    np.testing.assert_allclose(expected_grad("k3"), forward, atol=1e-6)
    assert np.abs(reverse - forward).max() > 1e-2, "the two KLs coincide here: the test could not tell them apart"
    assert LossOptions().kl_estimator == "k2", "the in-loss default must be the estimator whose gradient is the KL"


def test_dual_clip_caps_negative_advantage_tokens():
    """For A < 0 the per-token loss is min(max(-A r, -A clip(r)), -c A): tokens with r > c are capped (no gradient),
    the others and every A > 0 token are unchanged."""
    logp = jnp.log(jnp.array([[0.5, 2.0, 5.0, 5.0]]))  # ratios 0.5, 2, 5, 5 against old logp 0
    old = jnp.zeros((1, 4))
    adv = jnp.array([-1.0])
    w = jnp.full((1, 4), 0.25)
    mask = jnp.ones((1, 4))
    opts = LossOptions(is_cap=None, dual_clip=3.0)

    def per_token(lp, o, a):
        loss, sums = grpo_token_loss(lp, old, old, old, a, w, mask, o)
        return loss, sums

    loss, sums = per_token(logp, opts, adv)
    plain, _ = per_token(logp, opts._replace(dual_clip=None), adv)
    # per token with A = -1: max(r, clip(r, 0.8, 1.28)) = 0.8, 2, 5, 5; dual-clip caps 5 -> 3
    np.testing.assert_allclose(plain, 0.25 * (0.8 + 2 + 5 + 5), rtol=1e-6)
    np.testing.assert_allclose(loss, 0.25 * (0.8 + 2 + 3 + 3), rtol=1e-6)
    assert float(sums["dual_clip"]) == 2
    grad = jax.grad(lambda lp: per_token(lp, opts, adv)[0])(logp)
    np.testing.assert_allclose(grad[0, 2:], 0.0), "a dual-clipped token must give no gradient"
    np.testing.assert_allclose(grad[0, 1], 0.25 * 2.0, rtol=1e-6)
    pos, _ = per_token(logp, opts, -adv)
    pos_plain, _ = per_token(logp, opts._replace(dual_clip=None), -adv)
    np.testing.assert_allclose(pos, pos_plain), "dual-clip must not touch positive advantages"


def test_constant_reward_groups_marks_groups_whose_rewards_are_all_equal():
    rewards = np.array([1.0, 1.0, 0.0, 1.0, 0.3, 0.3, 0.3, 0.3])
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    constant = constant_reward_groups(rewards, groups)
    assert constant.tolist() == [False] * 4 + [True] * 4
    for std_normalize in (True, False):  # a constant group has advantage 0 under every variant
        assert not group_advantages(rewards, groups, std_normalize)[constant].any()
    assert not constant_reward_groups(np.array([0.0, 1e-9]), np.array([5, 5])).any()  # a tiny difference varies


# ---- the Tinker API's token losses (learner/token_losses.py) ------------------------------------------------------
def test_cispo_defaults_are_the_cookbooks_one_sided_clip():
    """cispo with no loss_fn_config clips the detached ratio to [0, 4] (tinker-cookbook's loss tutorial), not the
    old 0.8..1.2: a ratio of 3 keeps its weight 3, a ratio of 6 is capped at 4, a ratio of 0.5 stays 0.5. The loss
    and its gradient against NumPy written from the formula."""
    from learner.token_losses import loss_config, token_loss

    config = dict(loss_config("cispo", {}))
    assert config == {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    lp = np.log(np.array([[0.1, 0.2, 0.4, 0.3]], np.float32))  # the sampler's
    logp = lp + np.log(np.array([[3.0, 6.0, 0.5, 1.0]], np.float32))  # ratios 3, 6, 0.5, 1
    adv = np.array([[1.0, -2.0, 0.5, 1.5]], np.float32)
    mask = np.array([[1.0, 1.0, 1.0, 0.0]], np.float32)
    inputs = {"logprobs": jnp.asarray(lp), "advantages": jnp.asarray(adv)}
    loss, grad = jax.value_and_grad(lambda x: token_loss("cispo", x, inputs, jnp.asarray(mask), config))(
        jnp.asarray(logp))
    weight = np.array([[3.0, 4.0, 0.5, 1.0]])
    np.testing.assert_allclose(loss, -np.sum(mask * weight * logp * adv), rtol=1e-5)
    np.testing.assert_allclose(grad, -mask * weight * adv, rtol=1e-5)


@pytest.mark.parametrize("name", ["gspo", "stable_reinforce"])
def test_losses_the_sdk_lists_but_this_server_does_not_compute_are_refused_in_one_line(name):
    from learner.token_losses import loss_config

    with pytest.raises(ValueError, match=f"loss_fn '{name}' is not computed by this server") as err:
        loss_config(name, {})
    assert "\n" not in str(err.value)
