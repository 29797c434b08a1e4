"""Prompt sharing (learner/shared_prompts.py) is the plain forward computed with fewer tokens: one GRPO step with
it equals one step without it, per family, loss, metrics and updated LoRA, under a sampling transform with
penalties and truncation (the repetition penalty reads the prompt)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestration.update import ScoredSamples, grpo_step
from learner.config import LearnerConfig
from learner.learner import Learner
from learner.sampling import SamplingTransform
from orchestration.cli.tiny_models import GEMMA3_WINDOW, TINY_FAMILIES

pytestmark = pytest.mark.integration
SAMPLING = SamplingTransform(temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.2, presence_penalty=0.1)


def grouped_batch(prompt_lengths: list[int], samples: int, max_completion: int, seed: int = 0) -> ScoredSamples:
    """Groups of `samples` completions of one prompt each, prompts of different lengths (left padding matters)."""
    rng = np.random.default_rng(seed)
    prompts, comps = [], []
    for length in prompt_lengths:
        prompt = list(rng.integers(3, 500, length))
        for _ in range(samples):
            prompts.append(prompt)
            comps.append(list(rng.integers(3, 500, rng.integers(1, max_completion + 1))))
    n = len(prompts)
    return ScoredSamples(prompts, comps, [list(-rng.random(len(c)) - 0.5) for c in comps], rng.random(n),
                         np.repeat(np.arange(len(prompt_lengths)), samples), SAMPLING)


def one_step(path, batch: ScoredSamples, share: bool, **cfg) -> tuple[Learner, dict, dict]:
    """(learner, step metrics, LoRA change). Adam with eps 1 and lr 1 moves each weight by g / (|g| + 1), about
    the gradient itself: at the usual eps a first step is lr * sign(g), which float noise flips where g ~ 0."""
    learner = Learner(LearnerConfig.model_validate({"share_prompts": share, "lora": {"rank": 4, "alpha": 8},
                                                    "optimizer": {"lr": 1.0, "eps": 1.0}, **cfg}), path)
    before = learner.save_for_sampler().tensors
    metrics = grpo_step(learner, learner.cfg.grpo, batch)
    return learner, metrics, {k: v - before[k] for k, v in learner.save_for_sampler().tensors.items()}


def assert_same_step(path, batch: ScoredSamples, expect_shared: bool, **cfg) -> None:
    shared, got, change = one_step(path, batch, True, **cfg)
    assert (shared._layout is not None) == expect_shared, f"layout {shared._layout}: sharing not as expected"
    _, want, plain_change = one_step(path, batch, False, **cfg)
    for key in ("learner/loss", "learner/entropy", "learner/logprob_abs_diff", "learner/grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key
    scale = max(np.abs(v).max() for v in plain_change.values())
    assert scale > 0, "the step moved nothing: the comparison would be empty"
    for name, value in plain_change.items():
        np.testing.assert_allclose(change[name], value, rtol=1e-3, atol=1e-3 * scale, err_msg=name)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_a_step_with_shared_prompts_equals_the_plain_step(family, tiny_family_dir):
    # Within Gemma 3's window of 16 (prompt 4 + completion 8); 3 groups of 4 in micro-batches of 8: a micro-batch
    # holds 2 distinct prompts, one group split across two.
    batch = grouped_batch([2, 4, 3], samples=4, max_completion=8)
    assert_same_step(tiny_family_dir(family), batch, True, seq_bucket=4, grpo={"micro_batch_size": 8})


def test_gemma3_beyond_its_window_runs_plain_and_right(tiny_family_dir):
    batch = grouped_batch([GEMMA3_WINDOW, 5], samples=4, max_completion=12)
    assert_same_step(tiny_family_dir("gemma3"), batch, False, seq_bucket=4, grpo={"micro_batch_size": 8})


def test_prompts_in_several_updates_and_epochs(tiny_model_dir):
    """Off-policy steps (old logprobs from a separate forward, two updates a batch) share prompts the same way.
    (The prompt block is sharded like the batch: on the suite's 4 devices it has 4 rows, which pay off here.)"""
    batch = grouped_batch([12, 20, 9, 15], samples=4, max_completion=8, seed=1)
    assert_same_step(tiny_model_dir, batch, True, seq_bucket=8,
                     grpo={"micro_batch_size": 8, "mini_batch_size": 8, "epochs": 2})


def token_datums(prompt_lengths: list[int], samples: int, max_completion: int, loss: str, seed: int = 0):
    """A TokenBatch as an RL or SFT client builds one: per datum prompt + completion, targets the next tokens, the
    loss's gate input 0 at the prompt's positions (dro: no gate, every input non-zero)."""
    from learner.token_batch import TokenBatch

    rng = np.random.default_rng(seed)
    tokens, targets, inputs = [], [], []
    for length in prompt_lengths:
        prompt = list(rng.integers(3, 500, length))
        for _ in range(samples):
            seq = prompt + list(rng.integers(3, 500, rng.integers(1, max_completion + 1)))
            n, at_prompt = len(seq) - 1, np.arange(len(seq) - 1) < length - 1
            tokens.append(seq[:-1])
            targets.append(seq[1:])
            logprobs = np.where(at_prompt, 0.0, -rng.random(n) - 0.5).astype(np.float32)
            if loss == "cross_entropy":
                inputs.append({"weights": np.where(at_prompt, 0.0, 1.0).astype(np.float32)})
            elif loss == "dro":
                inputs.append({"logprobs": -rng.random(n).astype(np.float32) - 0.5,
                               "advantages": rng.normal(size=n).astype(np.float32)})
            else:
                inputs.append({"logprobs": logprobs,
                               "advantages": np.where(at_prompt, 0.0, rng.normal()).astype(np.float32)})
    return TokenBatch(tokens, targets, inputs)


def one_token_update(path, batch, loss: str, **cfg) -> tuple[Learner, dict, dict]:
    learner = Learner(LearnerConfig.model_validate({"lora": {"rank": 4, "alpha": 8},
                                                    "optimizer": {"lr": 1.0, "eps": 1.0}, **cfg}), path)
    before = learner.save_for_sampler().tensors
    out = learner.forward_backward(batch, loss)
    learner.optim_step()
    return learner, out, {k: v - before[k] for k, v in learner.save_for_sampler().tensors.items()}


@pytest.mark.parametrize("loss, share", [("cross_entropy", True), ("importance_sampling", False), ("dro", True)])
def test_token_losses_detach_and_share_prompts_exactly(loss, share, tiny_model_dir):
    """A token loss's forward_backward, each datum's prompt detached (and shared, the default), against the dense
    reference (learner.logprob_chunk=0: full logits at every position, plain autodiff): the same loss, every
    position's logprob, and the same update. The three ways: prompts shared (3 prompts x 4 datums in micro-batches
    of 8), prompts detached on plain rows (share_prompts off), and no prompt at all (dro's penalty reads every
    position: it runs plain)."""
    batch = token_datums([12, 20, 9], samples=4, max_completion=8, loss=loss, seed=2)
    cfg = {"seq_bucket": 8, "grpo": {"micro_batch_size": 8}}
    shared, got, change = one_token_update(tiny_model_dir, batch, loss, share_prompts=share, **cfg)
    assert (shared._layout is not None) == (share and loss != "dro"), f"layout {shared._layout}"
    _, want, dense_change = one_token_update(tiny_model_dir, batch, loss, logprob_chunk=0, **cfg)
    assert got["loss"] == pytest.approx(want["loss"], rel=2e-4, abs=2e-5)
    for i, (a, b) in enumerate(zip(got["logprobs"], want["logprobs"])):
        assert a.shape == b.shape == (len(batch.tokens[i]),)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-4, err_msg=f"datum {i}")
    scale = max(np.abs(v).max() for v in dense_change.values())
    assert scale > 0, "the step moved nothing: the comparison would be empty"
    for name, value in dense_change.items():
        np.testing.assert_allclose(change[name], value, rtol=1e-3, atol=1e-3 * scale, err_msg=name)
