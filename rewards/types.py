"""What a reward sees and what a reward is.

A built-in reward is a pure, deterministic, picklable callable on one `Sample`: the loop may run it on the driver or
ship it to any Ray worker, so it must not close over unpicklable state or import heavy frameworks. The completion is
model output and therefore hostile input: rewards parse it, never execute it. A user's reward (`fn:` in the config)
has TRL's batch signature instead and runs in a worker process (rewards/pool.py), never in the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Sample:
    """One completion to score, with the task data its reward needs."""

    prompt: str
    """Rendered prompt text; only used to make error messages findable."""
    completion: str
    """Model output text (hostile)."""
    reference: Mapping[str, Any] = field(default_factory=dict)
    """Task data: countdown {"numbers": [...], "target": int}; math {"answer": "42"}; a dataset row's other columns."""
    completion_ids: Sequence[int] = ()
    """The completion's token ids as the engine sampled them (TRL's `completion_ids`)."""
    raw_prompt: Any = None
    """The prompt as the task's row holds it: text, or a list of chat messages (TRL's `prompts`); None: `prompt`."""


@dataclass(frozen=True)
class TrainingProgress:
    """What a TRL-style reward reads from its `trainer_state` argument: how far the run is."""

    global_step: int
    """Learner updates finished before these samples were scored (TRL's `TrainerState.global_step`)."""
    max_steps: int
    """Steps the run is configured for (train.steps)."""


class RewardFn(Protocol):
    """A reward: pure, deterministic, picklable; `__name__` is its metric name (`reward/<name>`)."""

    __name__: str

    def __call__(self, sample: Sample) -> float: ...


@runtime_checkable
class BatchRewardFn(Protocol):
    """A reward scored a batch at a time (an LLM judge: one engine call per batch). A sample it cannot score gets
    an exception in its place, which the reward set handles per `rewards.on_error` like a raising reward."""

    __name__: str

    def score_batch(self, samples: Sequence[Sample]) -> list[float | Exception]: ...

    def take_metrics(self) -> dict[str, float]:
        """Additive counters since the last call (logged per step)."""
        ...
