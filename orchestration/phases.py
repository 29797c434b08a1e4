"""The loop's named phases: where the run is (for the line an interrupt prints), how long each took, and the one
point in each where a test's fault lands (orchestration/faults.py).

    with phases.enter("push", step) as push:
        adapter = learner.save_for_sampler(name=f"policy-v{step}")
        push.fault()                       # the LoRA is exported, not yet on the engines
        rollout.serve(adapter)
    push.seconds

A phase entered inside another (async generation ahead inside "learn") hands the run's place back to the outer one
when it ends normally. A fault fires at `fault()`, never on a timer: each phase calls it where its work is in flight.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from orchestration.faults import NO_FAULTS, FaultHook
from orchestration.state import LoopState


class Phase:
    """One entered phase: its name and step, its fault point and, once ended, its wall time."""

    def __init__(self, name: str, step: int, hook: FaultHook):
        self.name, self.step, self._hook = name, step, hook
        self.seconds = 0.0

    def fault(self) -> None:
        """The phase's fault point (a test's fault named for this phase and step lands here)."""
        self._hook(self.name, self.step)


class Phases:
    """Enters the loop's phases on one LoopState, with the run's fault hook."""

    def __init__(self, state: LoopState, hook: FaultHook = NO_FAULTS):
        self.state, self.hook = state, hook
        self._outer: list[tuple[str, int]] = []

    @contextmanager
    def enter(self, name: str, step: int) -> Iterator[Phase]:
        self._outer.append(self.state.where)
        self.state.where = (name, step)
        phase = Phase(name, step, self.hook)
        t0 = time.perf_counter()
        try:
            yield phase
        finally:
            phase.seconds = time.perf_counter() - t0
            outer = self._outer.pop()
        # Ended normally inside another phase: the outer one is where the run is again. An interrupt leaves the
        # inner phase named, as the place the run stopped.
        if self._outer:
            self.state.where = outer
