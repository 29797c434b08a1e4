"""`RolloutHandle`: what the loop, the evals, the episode driver and the judge may call on the rollout side.

One engine (`rollout.handle.Rollout`) and N replicas (`rollout.fleet.RolloutFleet`) both satisfy it, so nothing
above rollout/ asks which one it holds: "many" hides behind the handle, as it does behind the learner's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from common.lora_adapter import LoraAdapter
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
                 adapter: str | None = None) -> list[list[Completion]]:
        """n completions per prompt from the served adapter named `adapter` (None: the base model)."""
        ...

    def serve(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` under its name on every engine (replacing one of that name); returns once all have it."""
        ...

    def unserve(self, name: str) -> None:
        """Stop serving adapter `name` on every engine."""
        ...

    def metrics(self) -> dict[str, float]:
        """Per-replica figures (none for one engine)."""
        ...

    def stop(self) -> None:
        """Stop every engine; idempotent."""
        ...
