"""cross_entropy on [N, K] targets with [N, K] weights (the soft-target form tinker-cookbook's distillation sends):
each position's K logprobs are the model's own, exact against its full distribution; the loss and its gradient are
those of K datums of one target each; a datum of [N] targets beside it is unchanged. Fails on the old main, whose
TokenBatch refused 2-D targets."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from learner.config import LearnerConfig
from learner.learner import Learner
from learner.token_batch import TokenBatch

pytestmark = pytest.mark.integration
N, K, START = 24, 5, 7


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    learner = Learner(LearnerConfig.model_validate({"lora": {"rank": 4, "alpha": 16}}), tiny_model_dir)
    keys = iter(jax.random.split(jax.random.key(3), 1000))  # B off 0: the LoRA takes part
    learner.params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), learner.params)
    return learner


def soft_datum(seed: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 1000, N).tolist()
    targets = rng.integers(3, 1000, (N, K))
    weights = rng.dirichlet(np.ones(K), N).astype(np.float32) * (np.arange(N) >= START)[:, None]
    return tokens, targets, weights


def test_k_logprobs_are_the_full_distributions(learner):
    tokens, targets, weights = soft_datum(0)
    out = learner.forward(TokenBatch([tokens], [targets.tolist()], [{"weights": weights}]), "cross_entropy")
    [logp] = out["logprobs"]
    assert logp.shape == (N, K)
    logits = learner.logits(np.asarray([tokens]))[0].astype(np.float64)
    full = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        logits.max(-1, keepdims=True)
    reference = np.take_along_axis(full, targets, axis=-1)
    gap = float(np.max(np.abs(logp - reference)))
    assert gap <= 1e-5, f"[N, K] logprobs differ from the full distribution's by {gap:.1e}"
    assert np.isclose(out["loss"], -float(np.sum(weights * reference)), rtol=1e-5)


def test_loss_and_gradient_are_those_of_k_one_target_datums(learner):
    tokens, targets, weights = soft_datum(1)
    learner.forward_backward(TokenBatch([tokens], [targets.tolist()], [{"weights": weights}]), "cross_entropy")
    soft = jax.tree.map(np.asarray, learner.adapters["policy"].grads)
    learner.adapters["policy"].grads = None
    split = TokenBatch([tokens] * K, [targets[:, k].tolist() for k in range(K)],
                       [{"weights": weights[:, k]} for k in range(K)])
    learner.forward_backward(split, "cross_entropy")
    one_each = jax.tree.map(np.asarray, learner.adapters["policy"].grads)
    learner.adapters["policy"].grads = None
    size = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(one_each))
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(soft), jax.tree.leaves(one_each)))
    assert size > 0 and gap <= 1e-5 * size, f"gradient differs by {gap:.1e} (largest entry {size:.1e})"


def test_a_one_target_datum_beside_soft_ones_is_unchanged(learner):
    tokens, targets, weights = soft_datum(2)
    plain = np.random.default_rng(3).integers(3, 1000, 15).tolist()
    alone = learner.forward(TokenBatch([plain], [plain[1:] + [5]], [{"weights": np.ones(15, np.float32)}]),
                            "cross_entropy")["logprobs"][0]
    mixed = learner.forward(TokenBatch([tokens, plain], [targets.tolist(), plain[1:] + [5]],
                                       [{"weights": weights}, {"weights": np.ones(15, np.float32)}]), "cross_entropy")
    assert mixed["logprobs"][0].shape == (N, K) and mixed["logprobs"][1].shape == (15,)
    assert float(np.max(np.abs(mixed["logprobs"][1] - alone))) <= 1e-5


def test_soft_targets_are_for_cross_entropy_with_weights_of_their_shape(learner):
    tokens, targets, weights = soft_datum(4)
    zeros = np.zeros(N, np.float32)
    with pytest.raises(ValueError, match=r"\[N, K\] target_tokens \(soft targets\) are for cross_entropy"):
        learner.forward(TokenBatch([tokens], [targets.tolist()], [{"advantages": zeros, "logprobs": zeros}]), "ppo")
    with pytest.raises(ValueError, match="one value per position beside"):
        learner.forward(TokenBatch([tokens], [targets.tolist()], [{"weights": np.ones(N, np.float32)}]),
                        "cross_entropy")
