"""`SglangJaxConfig`: launch settings of the SGLang-JAX rollout engine (`rollout.backend.kind: sglang_jax`).

It extends `EngineConfig` (the fields every engine shares, `platform` and `extra_args` included), so switching
engines is that one key. The engine runs from its own env (Python 3.12, sglang-jax 0.0.2 with jax 0.8), built by
`bash scripts/setup_sglang_env.sh`. What its sampler honours is declared in `rollout/capabilities.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from rollout.engine_config import EngineConfig, engine_interpreter


def default_sglang_python() -> Path:
    """$AHA_SGLANG_PYTHON, else $AHA_CACHE/envs/sglang_jax/bin/python (AHA_CACHE default ~/.cache/aha)."""
    return engine_interpreter("AHA_SGLANG_PYTHON", "sglang_jax")


class SglangJaxConfig(EngineConfig):
    """An SGLang-JAX engine wrapped by `rollout/sglang_jax_entry.py` into our completions/health/LoRA contract.

    `platform` is the JAX platform it runs on; `extra_args` are `ServerArgs` fields (e.g. {"chunked_prefill_size":
    512}); `max_lora_rank` has no limit in the merge itself, the check keeps parity with vLLM.
    """

    interpreter_env_var: ClassVar[str] = "AHA_SGLANG_PYTHON"
    interpreter_env_name: ClassVar[str] = "sglang_jax"
    startup_timeouts_s: ClassVar[dict[str, float]] = {"cpu": 900.0, "gpu": 900.0, "tpu": 1800.0}
    """CPU start-up with compilation takes minutes when the box is busy (EngineConfig.startup_timeouts_s)."""

    kind: Literal["sglang_jax"] = "sglang_jax"
    """Backend selector."""
    max_total_tokens: int = Field(16384, ge=256)
    """KV cache size in tokens (all running requests together); on CPU this replaces memory profiling."""
    kv_cache_space_gb: float | None = Field(None, gt=0)
    """KV cache size in GiB instead of max_total_tokens (same key as vLLM's, so a config moves between engines)."""
    max_running_requests: int = Field(64, ge=1)
    """Sequences decoded together (a prompt with n samples counts n)."""
    page_size: int = Field(1, ge=1)
    """KV cache page size in tokens."""
    deterministic_sampling: bool = False
    """Per-request seeds (SGLang-JAX `--enable-deterministic-sampling`); without it a request `seed` is rejected."""
    random_seed: int = 0
    """Engine-wide sampling seed (start-up only)."""
    precompile: bool = False
    """Compile every batch/token bucket at start-up (minutes on CPU); off = compile each new shape on first use."""
