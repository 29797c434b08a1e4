"""`RolloutHandle`: what the loop, the evals, the episode driver and the judge may call on the rollout side.

One engine (`rollout.handle.Rollout`) and N replicas (`rollout.fleet.RolloutFleet`) both satisfy it, so nothing
above rollout/ asks which one it holds: "many" hides behind the handle, as it does behind the learner's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from common.sampling import Completion, SamplingParams


@runtime_checkable
class RolloutHandle(Protocol):
    events: list[str]
    """What happened to the engines besides normal work (restarts and why), oldest first."""

    @property
    def base_urls(self) -> list[str]:
        """Every engine's URL (one per replica)."""
        ...

    def start(self) -> str:
        """Start the engine(s); blocks until healthy."""
        ...

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None, *,
                 seeds: list[int] | None = None, on_sent: Callable[[], None] | None = None,
                 base_model: bool = False, adapter: str | None = None) -> list[list[Completion]]:
        """n completions per prompt with the current adapter (or the base model, or an adapter loaded by name)."""
        ...

    def push_lora(self, version: int, tensors: dict[str, np.ndarray], adapter_config: dict[str, Any]) -> float:
        """Make LoRA `version` current on every engine; returns the seconds it took."""
        ...

    def load_adapter(self, name: str, tensors: dict[str, np.ndarray], adapter_config: dict[str, Any]) -> None:
        """Serve another adapter under `name` on every engine, beside the policy's versions."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Stop serving an adapter loaded by name."""
        ...

    def metrics(self) -> dict[str, float]:
        """Per-replica figures (none for one engine)."""
        ...

    def stop(self) -> None:
        """Stop every engine; idempotent."""
        ...
