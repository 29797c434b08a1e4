"""The rollout contract, run against both engines: a real vLLM server and a real wrapped SGLang-JAX server.

Same functions, parametrised by `backend.kind`, each on the tiny Llama in float32 through the backend object (start,
load/unload LoRA, stop) and the shared `RolloutClient` (the data plane). Generations are few and short: SGLang-JAX
compiles every new batch shape on CPU (tens of seconds). Logprobs are checked against transformers (+ the adapter
merged by hand) run in the vLLM env, the project's reference implementation.

Sampling effects that need a real distribution (penalties, top-p, stop strings) are covered on SmolLM2 for vLLM by
test_rollout_sampling.py; here the tiny model only needs a prompt after which its distribution is broad.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import SETUP_HINT
from route_walk import key_holders, open_routes, walk
from rollout.client import RolloutClient
from rollout.config import ClientConfig, VllmConfig
from common.peft_adapter import random_peft_adapter, write_adapter
from rollout.sglang_jax_config import SglangJaxConfig, default_sglang_python
from rollout.sglang_jax_server import SglangJaxBackend
from common.sampling import Completion, SamplingParams
from rollout.vllm_server import VllmBackend

pytestmark = pytest.mark.integration

RANK = 8
KEY = "-contract-" + os.urandom(8).hex()  # a leading "-": an argument parser would take it for an option
# Random tokens: after them the tiny model's next-token distribution is broad at temperature 2 (entropy 9.4 nats;
# at temperature 1 it is 0.03: the random model's logits are huge).
PROMPT = [1, 7093, 32549, 26011, 36518, 20194, 24304, 38832, 29206]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
def make_adapter(model_dir: Path, seed: int, zero_b: bool = False, scale: float = 0.5):
    """PEFT LoRA tensors + config for every projection of the checkpoint (common.peft_adapter)."""
    return random_peft_adapter(model_dir, RANK, seed, scale=scale, zero_b=zero_b)


# Runs in the vLLM env (torch + transformers): logprob of each token of `ids` after the first `start`, with the
# adapter (if any) merged as W + alpha/r * B @ A.
REFERENCE = """
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
model_dir, adapter, ids, start = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
if adapter:
    cfg = json.load(open(adapter + "/adapter_config.json"))
    tensors = load_file(adapter + "/adapter_model.safetensors")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in tensors.items():
            if ".lora_A." in name:
                b = tensors[name.replace(".lora_A.", ".lora_B.")]
                target = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
                params[target] += cfg["lora_alpha"] / cfg["r"] * (b @ a)
with torch.no_grad():
    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
print(json.dumps([logp[i - 1, ids[i]].item() for i in range(start, len(ids))]))
"""


def reference_logprobs(engine_python: Path, model_dir: Path, prompt: list[int], completion: list[int],
                       adapter: Path | None = None) -> list[float]:
    out = subprocess.run([str(engine_python), "-c", REFERENCE, str(model_dir), str(adapter or ""),
                          json.dumps(prompt + completion), str(len(prompt))],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def sglang_available() -> bool:
    return default_sglang_python().exists()


@pytest.fixture(scope="module", params=["vllm", "sglang_jax"])
def server(request, tiny_model_dir, tmp_path_factory):
    """A started backend of each kind on the tiny model, with a client; stopped at the end of the module."""
    if request.param == "sglang_jax":
        if not sglang_available():
            pytest.fail(f"SGLang-JAX env missing at {default_sglang_python()}: {SETUP_HINT}", pytrace=False)
        backend = SglangJaxBackend(SglangJaxConfig(max_model_len=256, max_total_tokens=2048,
                                                   max_running_requests=8, api_key=KEY), tiny_model_dir,
                                   tmp_path_factory.mktemp("sglang"))
    else:
        backend = VllmBackend(VllmConfig(max_model_len=256, max_lora_rank=RANK, kv_cache_space_gb=1, api_key=KEY),
                              tiny_model_dir, tmp_path_factory.mktemp("vllm"))
    try:
        url = backend.start()
        yield backend, RolloutClient(url, ClientConfig(max_retries=0), backend)
    finally:
        backend.stop()


def generate(server, params: SamplingParams, lora: str | None = None, prompt: list[int] = PROMPT) -> list[Completion]:
    _, client = server
    [group] = asyncio.run(client.generate([prompt], params, lora))
    return group


def test_greedy_completion_shape_and_logprobs_match_reference(server, tiny_model_dir, engine_python):
    [c] = generate(server, GREEDY)
    assert len(c.token_ids) == 6 and len(c.logprobs) == 6 and c.finish_reason == "length"
    expected = reference_logprobs(engine_python, tiny_model_dir, PROMPT, c.token_ids)
    np.testing.assert_allclose(c.logprobs, expected, atol=2e-3, err_msg="engine logprobs differ from transformers")


def test_max_tokens_n_and_top_logprobs(server):
    group = generate(server, SamplingParams(temperature=2.0, n=3, max_tokens=4, ignore_eos=True, logprobs=2))
    assert len(group) == 3 and all(len(c.token_ids) == 4 and c.finish_reason == "length" for c in group)
    assert len({tuple(c.token_ids) for c in group}) > 1, "n samples at temperature 2 should differ"
    for c in group:
        assert len(c.extra["top_logprobs"]) == 4
        for lp, tops in zip(c.logprobs, c.extra["top_logprobs"], strict=True):
            assert len(tops) >= 2 and lp <= max(tops.values()) + 1e-5


def test_stop_token_ends_and_is_included(server):
    [greedy] = generate(server, GREEDY)
    stop = greedy.token_ids[0]
    [c] = generate(server, GREEDY.model_copy(update={"stop_token_ids": [stop]}))
    assert c.finish_reason == "stop" and c.token_ids == [stop], "completion must end at (and include) the stop token"


def test_unsupported_parameters_fail_before_sending(server):
    backend, _ = server
    for update in ({"repetition_penalty": 1.3}, {"seed": 7}):
        params = SamplingParams(**update)
        if isinstance(backend, SglangJaxBackend):
            name = next(iter(update))
            with pytest.raises(ValueError, match=f"sglang_jax .*{name}"):
                backend.build_payload(PROMPT, params, None)
        else:
            assert backend.build_payload(PROMPT, params, None)[next(iter(update))] == update[next(iter(update))]


def push(server, tmp_path: Path, version: int, seed: int, zero_b: bool = False) -> tuple[str, Path]:
    backend, _ = server
    name = f"policy-v{version}"
    folder = write_adapter(tmp_path / name, *make_adapter(Path(backend.model_path), seed, zero_b=zero_b))
    backend.load_lora(name, folder)
    return name, folder


def test_lora_push_versions_replace_and_unload(server, tmp_path, tiny_model_dir, engine_python):
    backend, _ = server
    [base] = generate(server, GREEDY)
    zero, _ = push(server, tmp_path, 1, seed=0, zero_b=True)
    [same] = generate(server, GREEDY, zero)
    assert same.token_ids == base.token_ids, "a zero-B adapter must not change the output"
    np.testing.assert_allclose(same.logprobs, base.logprobs, atol=1e-4)
    backend.unload_lora(zero)

    outputs = {}
    previous = None
    for version, seed in [(2, 10), (3, 11), (4, 10)]:
        name, folder = push(server, tmp_path, version, seed)
        if previous:
            backend.unload_lora(previous)
        [c] = generate(server, GREEDY, name)
        outputs.setdefault(seed, []).append((c.token_ids, c.logprobs))
        previous = name
    (ids10, lp10), (ids10b, lp10b) = outputs[10]
    assert ids10 != base.token_ids or not np.allclose(lp10, base.logprobs, atol=1e-3), "adapter had no effect"
    assert ids10 == ids10b, "the same adapter pushed again gave another output: weights accumulated or went stale"
    np.testing.assert_allclose(lp10, lp10b, atol=1e-4)
    expected = reference_logprobs(engine_python, tiny_model_dir, PROMPT, ids10b, folder)
    np.testing.assert_allclose(lp10b, expected, atol=2e-3, err_msg="adapter logprobs differ from transformers+LoRA")

    with pytest.raises(RuntimeError, match="404"):  # an unloaded version is refused, never served stale
        generate(server, GREEDY, "policy-v3")
    backend.unload_lora(previous)
    [again] = generate(server, GREEDY)
    assert again.token_ids == base.token_ids, "unloading the adapter did not bring the base model back"
    np.testing.assert_allclose(again.logprobs, base.logprobs, atol=1e-4)


def socket_files(pgid: int) -> set[str]:
    """The paths of the Unix sockets bound by the processes of group `pgid` (abstract ones have none)."""
    inodes = set()
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for fd in (proc / "fd").iterdir():
                if (link := os.readlink(fd)).startswith("socket:["):
                    inodes.add(link[8:-1])
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    rows = (line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:])
    return {row[7] for row in rows if len(row) > 7 and row[6] in inodes and row[7].startswith("/")}


def server_environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def test_every_route_refuses_a_request_without_the_key_on_either_engine(server):
    """Every route of each engine (each method of each path its OpenAPI lists, and FastAPI's documentation routes)
    answers 401 without the key and with a wrong one, /health alone answers; the client with the key is served; the
    key is in the engine's environment, on no command line. Fails on main at 98997ee: the SGLang-JAX app guarded
    /v1 only (its /docs and /openapi.json answered), vLLM answered `POST /invocations`, `/tokenize`, `/detokenize`
    and more without the key, and both engines had the key on their command line (readable by every local user)."""
    backend, _ = server
    got = walk(backend.base_url, KEY, backend.cfg.served_model_name)
    assert {"POST /v1/completions", "POST /v1/load_lora_adapter", "GET /openapi.json"} <= set(got["routes"]), got
    if backend.cfg.kind == "vllm":
        assert {"POST /invocations", "POST /tokenize", "DELETE /adapters/{adapter_name}"} <= set(got["routes"]), got
    assert not open_routes(got), f"{backend.engine_name}: routes that took no key or a wrong one: {got['routes']}"
    assert got["health"] == 200 and got["models"] in (200, 404) and got["completion"] == 200, got
    in_env, in_argv = key_holders(KEY)
    assert backend.pid() in in_env, f"{backend.engine_name}'s process {backend.pid()} did not get the key by its env"
    assert not in_argv, f"the key is on the command line of pids {in_argv} (readable by every local user)"


def test_stop_is_idempotent_and_restart_serves_again(server):
    """A server whose processes were killed (SIGKILL to its group, as the OOM killer or a lost node's cleanup
    does), then stopped twice: no socket file of it is left, nor its temporary folder. vLLM's IPC sockets (uuid-named,
    in /tmp by default) stayed after every killed engine, thousands on a box that ran the suite for a day, and so
    did its `vllm_dist_<uuid>` init files (the TMPDIR part fails before they moved to the start's folder)."""
    backend, _ = server
    pid = backend.pid()
    files = socket_files(pid)
    assert files or backend.engine_name != "vLLM", "vacuous: the vLLM server's processes hold no socket file"
    scratch = Path(server_environ(pid)["TMPDIR"])  # the start's own temporary folder, not the machine's
    assert scratch != Path(tempfile.gettempdir()) and scratch.is_dir(), scratch
    if backend.engine_name == "vLLM":  # its process-group init file, one per start: in /tmp before (946 after a day)
        assert list(scratch.glob("vllm_dist_*")), f"vLLM made no vllm_dist_ file in its TMPDIR {scratch}"
    os.killpg(pid, signal.SIGKILL)
    backend.stop()
    backend.stop()
    assert not backend.is_alive() and backend.pid() is None
    assert not [f for f in files if os.path.exists(f)], f"the killed server left its sockets: {sorted(files)}"
    assert not scratch.exists(), f"the killed server left its temporary files: {sorted(scratch.iterdir())}"
    url = backend.start()
    assert backend.pid() != pid and backend.is_alive()
    server_again = (backend, RolloutClient(url, ClientConfig(max_retries=0), backend))
    [c] = generate(server_again, GREEDY)
    assert len(c.token_ids) == 6


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


@pytest.fixture(scope="module")
def deterministic_sglang(tiny_model_dir, tmp_path_factory):
    """A second SGLang-JAX server with per-request seeds (deterministic sampling)."""
    if not sglang_available():
        pytest.fail(f"SGLang-JAX env missing at {default_sglang_python()}: {SETUP_HINT}", pytrace=False)
    backend = SglangJaxBackend(SglangJaxConfig(max_model_len=256, max_total_tokens=2048, max_running_requests=8,
                                               deterministic_sampling=True), tiny_model_dir,
                               tmp_path_factory.mktemp("sglang-det"))
    try:
        yield backend, RolloutClient(backend.start(), ClientConfig(max_retries=0), backend)
    finally:
        backend.stop()


def test_sglang_seed_reproduces_and_samples_the_model_distribution(deterministic_sglang):
    params = SamplingParams(seed=1234, n=4, temperature=2.0, max_tokens=6, ignore_eos=True, logprobs=1)
    a, b = generate(deterministic_sglang, params), generate(deterministic_sglang, params)
    other = generate(deterministic_sglang, params.model_copy(update={"seed": 99}))
    assert [c.token_ids for c in a] == [c.token_ids for c in b], "the same seed must reproduce the samples"
    assert a[0].token_ids != a[1].token_ids, "the n samples of one seeded request must differ"
    assert other[0].token_ids != a[0].token_ids, "another seed should give another sample"
    # At temperature 2 the most likely token has probability ~0.13 at each step here, so 48 draws from the model's
    # distribution hit it several times; a sampler that flattened the distribution (1/49152 each) would not.
    draws = [(t, tops) for c in a + other for t, tops in zip(c.token_ids, c.extra["top_logprobs"], strict=True)]
    hits = sum(str(t) == max(tops, key=tops.get) for t, tops in draws)
    assert 0 < hits < len(draws), f"{hits}/{len(draws)} draws were the most likely token: not the model's distribution"
