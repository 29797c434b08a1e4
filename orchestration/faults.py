"""A test-only fault hook: interrupt or kill a part of the run at a named phase, deterministically.

`AHA_FAULT="phase:action[@step][,phase:action[@step]...]"`, read once at start. Phases are the loop's named places:

    generate   generation requests are in flight (fired by the rollout handle once they are submitted)
    refill     a dynamic-sampling refill draw's requests are in flight (train.dynamic_sampling)
    score      the completions are back, the rewards are being computed
    learn      the learner update is submitted and running in the learner actor
    push       the new LoRA tensors are exported, not yet loaded by the engine
    save       a checkpoint save is submitted to the learner actor
    between    a step is finished and logged; the next one has not started
    eval       reserved for in-loop evaluation

Actions: `sigint` / `sigterm` (signal this process's main thread, which raises at once), `sigint_blocked` /
`sigterm_blocked` (the same signal, sent by a watcher thread once the main thread waits inside a Ray call of this
phase, e.g. the `ray.get` of a push, an update or a save: Ray then re-raises it as a plain KeyboardInterrupt),
`kill_engine` (SIGKILL the engine server's process group), `kill_learner` (kill the learner actor), `kill_node`
(SIGKILL the whole Ray node of the last engine replica, which must not be the driver's node: its server, its actor
and the node's raylet, as a host lost; the hook returns once Ray reports the actor dead). Without `@step` a fault
fires at the first step that reaches its phase; each fault fires once. No sleeps, no timing: a test names where the
fault lands.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

PHASES = ("generate", "refill", "score", "learn", "push", "save", "between", "eval")
ACTIONS = ("sigint", "sigterm", "sigint_blocked", "sigterm_blocked", "kill_engine", "kill_learner", "kill_node")
# The loop's function a phase's blocking Ray call is made from (orchestration/loop.py), for the *_blocked actions.
BLOCKING_CALLER = {"learn": "collect", "push": "push_lora", "save": "save_checkpoint"}
WATCH_LIMIT_S = 600.0
ENV = "AHA_FAULT"


@dataclass
class Fault:
    phase: str
    action: str
    step: int | None = None
    fired: bool = False


def parse(spec: str) -> list[Fault]:
    """`"learn:sigint@2,push:kill_engine"` -> faults; one-line ValueError naming a bad part."""
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        where, _, step = part.partition("@")
        phase, _, action = where.partition(":")
        if phase not in PHASES or action not in ACTIONS or (step and not step.isdigit()):
            raise ValueError(f"{ENV} entry {part!r} is not phase:action[@step] with phase in {PHASES} and "
                             f"action in {ACTIONS}")
        faults.append(Fault(phase, action, int(step) if step else None))
    return faults


class FaultHook:
    """Fires the configured faults; `parts` gives it the engine and the learner to kill."""

    def __init__(self, faults: list[Fault]):
        self.faults = faults
        self.parts: Any = None
        self.phase = ""  # of the fault being fired

    @classmethod
    def from_env(cls) -> FaultHook:
        return cls(parse(os.environ.get(ENV, "")))

    def __call__(self, phase: str, step: int) -> None:
        for fault in self.faults:
            if not fault.fired and fault.phase == phase and fault.step in (None, step):
                fault.fired = True
                log.warning("%s: %s at phase %s of step %d", ENV, fault.action, phase, step)
                self.phase = phase
                self._fire(fault.action)

    def _fire(self, action: str) -> None:
        import ray

        if action.endswith("_blocked"):
            signum = signal.SIGINT if action.startswith("sigint") else signal.SIGTERM
            threading.Thread(target=signal_when_blocked, args=(signum, BLOCKING_CALLER.get(self.phase)),
                             daemon=True, name="aha-fault").start()
        elif action in ("sigint", "sigterm"):
            # To the main thread, as a terminal's Ctrl-C lands: its blocking wait is interrupted at once even when
            # the hook runs in the rollout's request thread (a signal taken by that thread would wait for it).
            signum = signal.SIGINT if action == "sigint" else signal.SIGTERM
            signal.pthread_kill(threading.main_thread().ident, signum)
        elif action == "kill_engine":
            pgid = ray.get(self.parts.rollout.actor.pid.remote())
            os.killpg(pgid, signal.SIGKILL)
        elif action == "kill_node":
            kill_engine_node(self.parts.rollout)
        elif action == "kill_learner":
            # One process of a multi-host learner (learner.hosts > 1) is enough to stop the whole group.
            actors = self.parts.learner.actors
            ray.kill(actors[-1], no_restart=True)


def kill_engine_node(rollout: Any, timeout_s: float = 180.0) -> None:
    """Kill the node of the last engine replica (or of the single engine) and wait until Ray says its actor died."""
    import ray

    replicas = getattr(rollout, "replicas", None)
    actor = replicas[-1].rollout.actor if replicas else rollout.actor
    node = ray.get(actor.node.remote())
    if node == ray.util.get_node_ip_address():
        raise ValueError(f"{ENV} kill_node: the engine runs on the driver's node {node}; place it on another node")
    ref = actor.kill_node.remote()
    try:
        ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayActorError:
        return  # the actor died with its node, as intended
    except ray.exceptions.GetTimeoutError:
        log.warning("%s kill_node: Ray did not report the engine's actor dead within %.0f s", ENV, timeout_s)


NO_FAULTS = FaultHook([])


def in_ray_get(frame: Any, caller: str | None) -> bool:
    """Whether the stack of `frame` is blocked in Ray's get (its innermost frame), called from `caller` if given."""
    if frame is None or frame.f_code.co_name != "get_objects" or "ray" not in frame.f_code.co_filename:
        return False
    while caller and frame is not None and frame.f_code.co_name != caller:
        frame = frame.f_back
    return frame is not None


def signal_when_blocked(signum: int, caller: str | None) -> None:
    """Send `signum` to the main thread once it waits inside `ray.get` (from `caller`); gives up after a while."""
    main = threading.main_thread()
    deadline = time.monotonic() + WATCH_LIMIT_S
    while time.monotonic() < deadline:
        if in_ray_get(sys._current_frames().get(main.ident), caller):
            signal.pthread_kill(main.ident, signum)
            return
        time.sleep(0.001)  # a push's Ray call lasts tens of milliseconds; Ray's wait releases the GIL
    log.error("%s: the main thread never waited in a Ray call from %s; no signal sent", ENV, caller)
