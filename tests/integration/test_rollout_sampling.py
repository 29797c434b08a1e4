"""Each sampling parameter has its effect on a real vLLM server (tiny Llama, float32) behind a real Ray actor.

The tiny model is random, so tests compare against its own greedy output instead of expected text: e.g. a stop
token is taken from the greedy completion and the stopped completion must be that completion's prefix.
"""

from __future__ import annotations

import math
import tempfile

import httpx
import pytest
import ray

from rollout.config import RolloutConfig, VllmConfig
from rollout.handle import Rollout
from rollout.types import SamplingParams

pytestmark = pytest.mark.integration

PROMPT = [1, 9690, 198, 504, 3458, 314, 260, 1345, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
# A prompt that loops: greedy decoding continues the loop, which repetition_penalty should break.
LOOP_PROMPT = [1, 4194, 314, 253, 1345, 30, 28, 29, 30, 28, 29, 30, 28, 29, 30, 28, 29, 30, 28, 29]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def rollout(tiny_model_dir):
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, max_lora_rank=8, kv_cache_space_gb=1))
    rollout = Rollout(cfg, tiny_model_dir)
    try:
        rollout.start()
        yield rollout
    finally:
        rollout.stop()
        if started:
            ray.shutdown()


def one(rollout: Rollout, params: SamplingParams, prompt: list[int] = PROMPT):
    [[completion]] = rollout.generate([prompt], params)
    return completion


@pytest.fixture(scope="module")
def greedy(rollout):
    return one(rollout, GREEDY)


def test_completion_shape_and_logprobs(greedy):
    assert len(greedy.token_ids) == 24 and greedy.finish_reason == "length"
    assert len(greedy.logprobs) == len(greedy.token_ids)
    assert all(math.isfinite(x) and x <= 1e-6 for x in greedy.logprobs)
    assert greedy.adapter_version is None


def test_max_tokens_is_honoured(rollout):
    c = one(rollout, SamplingParams(max_tokens=5, ignore_eos=True, seed=1))
    assert len(c.token_ids) == 5 and c.finish_reason == "length"


def first_new_token_index(ids: list[int], start: int) -> int:
    return next(i for i in range(start, len(ids)) if ids[i] not in ids[:i])


def test_stop_token_ids_cut(rollout, greedy):
    k = first_new_token_index(greedy.token_ids, 3)
    c = one(rollout, GREEDY.model_copy(update={"stop_token_ids": [greedy.token_ids[k]]}))
    assert c.finish_reason == "stop"
    assert c.token_ids == greedy.token_ids[:k + 1], "completion must end at (and include) the stop token"


def test_min_tokens_is_honoured(rollout, greedy):
    k = first_new_token_index(greedy.token_ids, 1)
    params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[greedy.token_ids[k]], min_tokens=k + 6)
    c = one(rollout, params)
    assert len(c.token_ids) >= k + 6, "min_tokens must keep the stop token from ending the sample early"


def test_stop_strings_cut(rollout, greedy):
    text = greedy.text
    middle = len(text) // 2
    stop = text[middle:middle + 4]
    assert stop.strip(), f"greedy text has no usable middle: {text!r}"
    c = one(rollout, GREEDY.model_copy(update={"stop": [stop]}))
    assert c.finish_reason == "stop"
    assert c.text == text[:text.index(stop)], "text must end right before the stop string"


def test_n_returns_n_distinct_samples(rollout):
    [group] = rollout.generate([PROMPT], SamplingParams(n=6, max_tokens=12, ignore_eos=True))
    assert len(group) == 6 and all(len(c.token_ids) == 12 for c in group)
    assert len({tuple(c.token_ids) for c in group}) > 1, "n samples at temperature 1 should differ"


def test_seed_reproduces_a_lone_request(rollout):
    params = SamplingParams(seed=1234, max_tokens=16, ignore_eos=True)
    a, b = one(rollout, params), one(rollout, params)
    other = one(rollout, params.model_copy(update={"seed": 99}))
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert other.token_ids != a.token_ids, "a different seed should give a different sample"


def test_top_k_1_gives_identical_samples(rollout, greedy):
    [group] = rollout.generate([PROMPT], SamplingParams(n=4, top_k=1, max_tokens=24, ignore_eos=True))
    assert all(c.token_ids == greedy.token_ids for c in group), "top_k=1 must reduce sampling to greedy"
    # Processed logprobs come from the top-k-truncated distribution: the only token left has probability 1.
    assert all(abs(x) < 1e-4 for c in group for x in c.logprobs)


def repeated_ngram_rate(ids: list[int], n: int = 3) -> float:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def test_repetition_penalty_lowers_repetition(rollout):
    base = one(rollout, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), LOOP_PROMPT)
    penal = one(rollout, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, repetition_penalty=2.0),
                LOOP_PROMPT)
    assert repeated_ngram_rate(base.token_ids) > 0.3, f"prompt did not loop: {base.token_ids}"
    assert repeated_ngram_rate(penal.token_ids) < repeated_ngram_rate(base.token_ids)


def test_logprobs_sum_consistently(rollout):
    """Sampled-token logprobs (temperature 1, no truncation) equal the prompt logprobs of the same tokens re-fed."""
    c = one(rollout, SamplingParams(seed=5, max_tokens=12, ignore_eos=True, logprobs=3))
    assert all(math.isfinite(x) for x in c.logprobs)
    for lp, tops in zip(c.logprobs, c.extra["top_logprobs"], strict=True):
        assert math.log(sum(math.exp(v) for v in tops.values())) <= 1e-5, "top-k probabilities exceed 1"
        assert lp <= max(tops.values()) + 1e-5
    body = {"model": "base", "prompt": PROMPT + c.token_ids, "max_tokens": 1, "prompt_logprobs": 0,
            "temperature": 1.0}
    scored = httpx.post(f"{rollout.base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    refed = [next(iter(d.values()))["logprob"] if len(d) == 1 else d[str(t)]["logprob"]
             for d, t in zip(scored["prompt_logprobs"][len(PROMPT):], c.token_ids, strict=True)]
    assert sum(c.logprobs) == pytest.approx(sum(refed), abs=1e-3)


def test_invalid_requests_fail_before_sending(rollout):
    with pytest.raises(ValueError, match="exceeds rollout.backend.max_model_len"):
        rollout.generate([PROMPT * 40], SamplingParams(max_tokens=16))
    with pytest.raises(ValueError, match="non-empty"):
        rollout.generate([[]])
