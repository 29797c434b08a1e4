"""learner.pad_to_largest: a GRPO step whose batch is shorter than an earlier one's runs the earlier (compiled)
shapes instead of compiling its own, with the same loss and update; `learner/compile_s` shows which steps compiled.

Before it, every step whose sampled lengths fell in another bucket compiled anew (the demo's learn phase read
32-48 s at steps 1, 4, 5, 21 and 22 against ~6 s otherwise, and bench_loop's async mean counted them as slow
updates)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from orchestration.update import ScoredSamples, grpo_step
from learner.config import LearnerConfig
from learner.learner import Learner
from learner.sampling import SamplingTransform

pytestmark = pytest.mark.integration
G = 4  # group size


def batch(rng: np.random.Generator, prompt: int, completion: int) -> ScoredSamples:
    """Two groups of G samples: `prompt` tokens each, `completion` tokens, varied rewards."""
    prompts = [list(rng.integers(3, 49000, prompt)) for _ in range(2)]
    return ScoredSamples(
        prompt_ids=[prompts[i // G] for i in range(2 * G)],
        completion_ids=[list(rng.integers(3, 49000, completion)) for _ in range(2 * G)],
        engine_logprobs=[list(rng.uniform(-6, -1, completion)) for _ in range(2 * G)],
        rewards=rng.uniform(0, 1, 2 * G).astype(np.float32), group_ids=np.repeat(np.arange(2), G),
        sampling=SamplingTransform(temperature=1.0))


def learner(tiny_model_dir, pad: bool) -> Learner:
    return Learner(LearnerConfig.model_validate({
        "devices": {"offset": 0, "count": 1}, "seq_bucket": 8, "pad_to_largest": pad, "optimizer": {"lr": 1e-3},
        "grpo": {"micro_batch_size": 2 * G}}), tiny_model_dir)


def test_a_shorter_step_runs_the_compiled_shapes_with_the_same_update(tiny_model_dir):
    rng = np.random.default_rng(0)
    long, short = batch(rng, 12, 20), batch(rng, 5, 3)  # length 32 / window 24 vs 8 / 8 in buckets of 8
    padded, own = learner(tiny_model_dir, True), learner(tiny_model_dir, False)
    first = [grpo_step(padded, padded.cfg.grpo, long), grpo_step(own, own.cfg.grpo, long)]
    assert all(m["learner/compile_s"] > 0 for m in first), "the first step compiles: compile_s must show it"
    again, fresh = grpo_step(padded, padded.cfg.grpo, short), grpo_step(own, own.cfg.grpo, short)

    assert fresh["learner/compile_s"] > 0, "without the floor, the shorter batch's shapes compile anew"
    assert again["learner/compile_s"] == 0, (
        f"pad_to_largest: the shorter batch compiled ({again['learner/compile_s']:.2f} s) instead of running the "
        "first step's shapes")
    for key in ("loss", "grad_norm", "entropy", "logprob_abs_diff"):
        np.testing.assert_allclose(again[f"learner/{key}"], fresh[f"learner/{key}"], rtol=1e-5, atol=1e-6,
                                   err_msg=f"padding to the larger shapes changed learner/{key}")
    for a, b in zip(jax.tree.leaves(padded.params), jax.tree.leaves(own.params)):
        # Adam moves each element by ~lr x sign(grad): compare at the scale of one step (lr 1e-3).
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_a_resumed_learner_pads_as_the_uninterrupted_one(tiny_model_dir, tmp_path):
    """The floor is checkpointed: after a resume, the next step runs the shapes (and so the rounding) the
    uninterrupted run's next step runs, not the smaller ones a fresh floor would give."""
    rng = np.random.default_rng(1)
    long, short = batch(rng, 12, 20), batch(rng, 5, 3)
    cfg = lambda: LearnerConfig.model_validate({  # noqa: E731
        "devices": {"offset": 0, "count": 1}, "seq_bucket": 8, "optimizer": {"lr": 1e-3},
        "grpo": {"micro_batch_size": 2 * G}})
    first = Learner(cfg(), tiny_model_dir, checkpoint_dir=tmp_path)
    grpo_step(first, first.cfg.grpo, long)
    first.save(1)
    resumed = Learner(cfg(), tiny_model_dir, checkpoint_dir=tmp_path)
    assert resumed.restore()[0] == 1
    assert resumed._floor == first._floor, f"restored floor {resumed._floor}, saved {first._floor}"
    went_on, after_resume = grpo_step(first, first.cfg.grpo, short), grpo_step(resumed, resumed.cfg.grpo, short)
    assert after_resume["learner/loss"] == went_on["learner/loss"], "the resumed step does not equal the uninterrupted"
    first.close()
    resumed.close()


@pytest.mark.parametrize("loss", ["importance_sampling", "cross_entropy"])
def test_a_clients_shorter_batch_runs_the_compiled_token_shapes_with_the_same_result(loss, tiny_model_dir):
    """The training service's token losses keep their own floor: a client's RL loop sends other prompt and
    completion lengths every step, and each new bucket compiled the forward_backward anew (the Tinker RL test's
    six steps took 255 s on this box, 42 s a step). The shorter batch's loss, logprobs and update are its own."""
    from test_shared_prompts import token_datums

    long, short = token_datums([14, 9], 4, 12, loss, seed=3), token_datums([5, 3], 4, 3, loss, seed=4)
    padded, own = learner(tiny_model_dir, True), learner(tiny_model_dir, False)
    for each in (padded, own):
        each.forward_backward(long, loss)
        assert each.optim_step()["learner/compile_s"] > 0, "the first batch compiles: compile_s must show it"
    # One learner's forward_backward and optim_step at a time: compile_s counts the process's compiles in between.
    again, again_metrics = padded.forward_backward(short, loss), padded.optim_step()
    fresh, fresh_metrics = own.forward_backward(short, loss), own.optim_step()

    assert fresh_metrics["learner/compile_s"] > 0, "without the floor, the shorter batch's shapes compile anew"
    assert again_metrics["learner/compile_s"] == 0, (
        f"pad_to_largest: the shorter token batch compiled ({again_metrics['learner/compile_s']:.2f} s) instead of "
        "running the first batch's shapes")
    np.testing.assert_allclose(again["loss"], fresh["loss"], rtol=1e-5, atol=1e-6)
    assert [len(x) for x in again["logprobs"]] == [len(x) for x in short.tokens], "a logprob per input position"
    for a, b in zip(again["logprobs"], fresh["logprobs"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(padded.params), jax.tree.leaves(own.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
