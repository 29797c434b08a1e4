"""What the loop holds: the parts it drives, one step's generated batch, an update in flight, and where it stands.

Kept apart from the loop so the in-loop eval, the run and the tests name these types without importing the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.sampling import Completion
from learner.handle import LearnerHandle, Pending
from orchestration.update import UpdatePlan
from orchestration.metrics import MetricsLog
from orchestration.run_dir import RunDir
from rewards.registry import RewardSet
from rollout.protocol import RolloutHandle
from tasks import Prompt, PromptStream
from tasks.environments.base import Environment
from tasks.render import PromptRenderer


@dataclass
class Parts:
    """The live components the loop drives (started by orchestration/cluster/launch.py), each behind its handle."""

    rollout: RolloutHandle
    learner: LearnerHandle
    rewards: RewardSet
    stream: PromptStream
    renderer: PromptRenderer
    metrics: MetricsLog
    run_dir: RunDir
    environment: Environment | None = None  # multi-turn: every sample is an episode of it


@dataclass
class StepBatch:
    """One step's generated, scored samples, plus where the data stream stands before and after them."""

    step: int
    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    completions: list[list[Completion]]
    stream_state: dict  # data position before these prompts were drawn
    stream_after: dict  # data position once they are drawn (what a checkpoint after this step records)
    metrics: dict[str, float] = field(default_factory=dict)
    totals: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each prompt as the model read it (chat template applied)
    policy_step: int = 0  # the policy version (learner steps) that generated it; 0: the base model


@dataclass
class InFlight:
    """A learner update submitted but not yet collected: if the run is interrupted, it is finished and saved."""

    step: int
    plan: UpdatePlan  # the step's mini-batches and epochs (orchestration/update.py)
    calls: list[tuple[Pending[dict], Pending[dict]]]  # each update's forward_backward and optim_step, in order
    data_after: dict  # data position once this step's prompts are consumed
    metrics: dict  # the step's rollout metrics, logged with the learner's once it is collected


@dataclass
class LoopState:
    """What an interrupted run needs to save: the last finished step, the data position after it, and its metrics
    row while it is open (the push and the step's timings join it before it is written)."""

    step: int
    data: dict
    saved_step: int
    in_flight: InFlight | None = None
    row: dict | None = None  # the learned step's metrics row, not written yet
    where: tuple[str, int] = ("start", 0)  # (phase, step) the loop is in, for the line an interrupt prints

    def learned(self, step: int, data_after: dict, metrics: dict) -> None:
        """Step `step`'s update is applied: it is now the step a checkpoint records, and `metrics` opens its row."""
        self.step, self.data, self.in_flight, self.row = step, data_after, None, dict(metrics)

    def add(self, figures: dict) -> None:
        """More figures for the open row."""
        self.row.update(figures)

    def write_row(self, metrics: MetricsLog) -> None:
        """Write the open row (if any) to metrics.jsonl and close it."""
        if self.row is not None:
            metrics.log(self.step, self.row)
            self.row = None
