"""`SglangJaxConfig`: launch settings of the SGLang-JAX rollout engine (`rollout.backend.kind: sglang_jax`).

It sits beside `VllmConfig` in the `backend` union and keeps the fields the rest of the rollout part reads from any
backend (`max_model_len`, `max_logprobs`, `python`, `host`, `port`, `served_model_name`, `startup_timeout_s`), so
switching engines is that one key. The engine runs from its own env (Python 3.12, sglang-jax 0.0.2 with jax 0.8),
built by `bash scripts/setup_sglang_env.sh`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout.server_process import engine_interpreter


def default_sglang_python() -> Path:
    """$AHA_SGLANG_PYTHON, else $AHA_CACHE/envs/sglang_jax/bin/python (AHA_CACHE default ~/.cache/aha)."""
    return engine_interpreter("AHA_SGLANG_PYTHON", "sglang_jax")


class SglangJaxConfig(BaseModel):
    """An SGLang-JAX engine wrapped by `rollout/sglang_jax_entry.py` into our completions/health/LoRA contract."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: Literal["sglang_jax"] = "sglang_jax"
    """Backend selector."""
    python: str | None = None
    """Interpreter of the SGLang-JAX env; None = $AHA_SGLANG_PYTHON or $AHA_CACHE/envs/sglang_jax/bin/python."""
    host: str = "127.0.0.1"
    """Address the server binds to."""
    port: int | None = Field(None, ge=1, le=65535)
    """Server port; None = a free port picked at start."""
    served_model_name: str = "base"
    """Model name of the base model in requests (the merged adapter is addressed by its own name)."""
    device: Literal["cpu", "tpu", "gpu"] = "cpu"
    """JAX platform the engine runs on."""
    dtype: str = "float32"
    """Weights/activations dtype (`--dtype` of SGLang-JAX)."""
    max_model_len: int = Field(2048, ge=16)
    """Context length (prompt + completion) a request may use."""
    max_total_tokens: int = Field(16384, ge=256)
    """KV cache size in tokens (all running requests together); on CPU this replaces memory profiling."""
    kv_cache_space_gb: float | None = Field(None, gt=0)
    """KV cache size in GiB instead of max_total_tokens (same key as vLLM's, so a config moves between engines)."""
    max_lora_rank: int = Field(16, ge=1)
    """Largest LoRA rank push_lora accepts; the merge has no limit of its own, the check keeps parity with vLLM."""
    max_running_requests: int = Field(64, ge=1)
    """Sequences decoded together (a prompt with n samples counts n)."""
    page_size: int = Field(1, ge=1)
    """KV cache page size in tokens."""
    max_logprobs: int = Field(20, ge=0)
    """Most top logprobs a request may ask for."""
    deterministic_sampling: bool = False
    """Per-request seeds (SGLang-JAX `--enable-deterministic-sampling`); without it a request `seed` is rejected."""
    random_seed: int = 0
    """Engine-wide sampling seed (start-up only)."""
    cpu_threads: int | None = Field(None, ge=1)
    """CPU only: threads of the engine; None = all cores (Ray sets OMP_NUM_THREADS=1 in workers otherwise)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Devices one model is split across (`--tp-size`)."""
    precompile: bool = False
    """Compile every batch/token bucket at start-up (minutes on CPU); off = compile each new shape on first use."""
    extra_args: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Extra `ServerArgs` fields of SGLang-JAX, applied last (e.g. {"chunked_prefill_size": 512})."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process, applied last."""
    startup_timeout_s: float = Field(900.0, gt=0)
    """How long to wait for /health after launch (CPU start-up with compilation takes minutes when busy)."""

    @property
    def interpreter(self) -> Path:
        """Resolved engine interpreter."""
        return Path(self.python).expanduser() if self.python else default_sglang_python()
