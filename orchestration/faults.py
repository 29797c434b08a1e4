"""A test-only fault hook: interrupt or kill a part of the run at a named phase, deterministically.

`AHA_FAULT="phase:action[@step][,phase:action[@step]...]"`, read once at start. Phases are the loop's named places:

    generate   generation requests are in flight (fired by the rollout handle once they are submitted)
    refill     a dynamic-sampling refill draw's requests are in flight (train.dynamic_sampling)
    score      the completions are back, the rewards are being computed
    learn      the learner update is submitted and running in the learner actor
    push       the new LoRA tensors are exported, not yet loaded by the engine
    save       a checkpoint save is submitted to the learner actor
    between    a step is finished and logged; the next one has not started
    eval       the in-loop eval's generation requests are in flight (eval.every; `aha eval`'s too, at step 0)

Actions: `sigint` / `sigterm` (signal this process's main thread, which raises at once), `sigint_blocked` /
`sigterm_blocked` (the same signal, sent by a watcher thread once the main thread waits inside a Ray call of this
phase, e.g. the `ray.get` of a push, an update or a save: Ray then re-raises it as a plain KeyboardInterrupt),
`kill_engine` (SIGKILL the engine server's process group), `kill_learner` (kill the learner actor), `kill_node`
(SIGKILL the whole Ray node of the last engine replica, which must not be the driver's node: its server, its actor
and the node's raylet, as a host lost; the hook returns once Ray reports the actor dead), `hold` (for a signal sent
from outside, below). Without `@step` a fault fires at the first step that reaches its phase; each fault fires once.
No sleeps, no timing: a test names where the fault lands.

`hold` keeps the phase's work in flight until the process takes SIGINT or SIGTERM from outside (a user, a scheduler,
`ray job stop`): it stops (SIGSTOP) what the phase waits for, the engines (generate, refill, eval, push), the
learner's processes (learn, save) or the reward pool's workers (score: a run with a user's `fn` reward), and once the
main thread waits in the phase's own call (`WAITING_IN`) it writes "PHASE STEP" to the file named by
`AHA_FAULT_HELD`. Between steps the driver waits on nothing: the hold keeps the main thread itself in the phase's
fault point, where the signal lands. The test waits for that file, so it knows where the process is
when it sends the signal; the processes are continued (SIGCONT) as soon as a signal has been taken, when the test
deletes the file (a release without a signal: it has done what it wanted done meanwhile, e.g. taken a host's link
down), or after `HOLD_LIMIT_S`. Those processes must be on this host (the tests' box), as the engine kills' are.
"""

from __future__ import annotations

import contextlib
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
ACTIONS = ("sigint", "sigterm", "sigint_blocked", "sigterm_blocked", "kill_engine", "kill_learner", "kill_node",
           "hold")
# The loop's function a phase's blocking Ray call is made from (orchestration/loop.py), for the *_blocked actions.
BLOCKING_CALLER = {"learn": "collect", "push": "serve", "save": "save_checkpoint"}
# Where the main thread waits while a phase's work is in flight (`hold`): its caller, and what a hold stops.
WAITING_IN = {"generate": "sample_groups", "refill": "sample_groups", "eval": "sample_groups", "score": "score",
              **BLOCKING_CALLER}
# "driver": nothing runs elsewhere; the main thread is held in the fault point itself.
HELD_PART = {"generate": "engines", "refill": "engines", "eval": "engines", "push": "engines", "learn": "learner",
             "save": "learner", "score": "rewards", "between": "driver"}
WATCH_LIMIT_S = 600.0
HOLD_LIMIT_S = 600.0
ENV = "AHA_FAULT"
HELD_ENV = "AHA_FAULT_HELD"


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
        self.phase, self.step = "", 0  # of the fault being fired

    @classmethod
    def from_env(cls) -> FaultHook:
        return cls(parse(os.environ.get(ENV, "")))

    def __call__(self, phase: str, step: int) -> None:
        for fault in self.faults:
            if not fault.fired and fault.phase == phase and fault.step in (None, step):
                fault.fired = True
                log.warning("%s: %s at phase %s of step %d", ENV, fault.action, phase, step)
                self.phase, self.step = phase, step
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
        elif action == "hold" and HELD_PART[self.phase] == "driver":
            hold_main_thread(self.phase, self.step)
        elif action == "hold":
            groups, pids = held_processes(self.parts, HELD_PART[self.phase])
            for pgid in groups:
                os.killpg(pgid, signal.SIGSTOP)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            threading.Thread(target=hold_until_signalled, args=(self.phase, self.step, groups, pids), daemon=True,
                             name="aha-fault-hold").start()


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
    return called_from(frame, caller)


def called_from(frame: Any, caller: str | None) -> bool:
    """Whether `caller` (a function name; None: any) is on the stack of `frame`."""
    while caller and frame is not None and frame.f_code.co_name != caller:
        frame = frame.f_back
    return frame is not None


def waiting(frame: Any, caller: str) -> bool:
    """Whether the stack of `frame` waits (in Ray's get, or on a lock, event or future) from `caller`."""
    if frame is None:
        return False
    ray_get = frame.f_code.co_name == "get_objects" and "ray" in frame.f_code.co_filename
    lock_wait = frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("threading.py")
    # The reward pool waits for its workers' pipes in multiprocessing.connection.wait, a selector's select.
    pipe_wait = frame.f_code.co_name == "select" and frame.f_code.co_filename.endswith("selectors.py")
    return (ray_get or lock_wait or pipe_wait) and called_from(frame, caller)


def held_processes(parts: Any, part: str) -> tuple[list[int], list[int]]:
    """What a hold stops: (process groups, processes). The engines: each replica's server process group; the
    learner: each of its processes, found in Ray's actor table (a call to the actor would queue behind its work);
    the rewards: the reward pool's workers."""
    import ray

    if part == "rewards":
        pool = parts.rewards.pool
        if pool is None:
            raise ValueError(f"{ENV} score:hold stops the reward pool's workers, and this run has none: give it a "
                             "user's reward (a rewards.terms entry with `fn:`)")
        return [], pool.worker_pids()
    if part == "engines":
        rollout = parts.rollout
        replicas = getattr(rollout, "replicas", None)
        actors = [r.rollout.actor for r in replicas] if replicas else [rollout.actor]
        live = [a for a in actors if a is not None]  # a replica being rebuilt may have no actor yet
        return [pgid for pgid in ray.get([a.pid.remote() for a in live]) if pgid is not None], []
    from ray._private import state  # the actor table: Ray's public state API needs the dashboard, off in a local run

    return [], [int(state.actors(actor._actor_id.hex())["Pid"]) for actor in parts.learner.actors]


def hold_until_signalled(phase: str, step: int, groups: list[int], pids: list[int]) -> None:
    """Once the main thread waits in `phase`'s call, say so in the `AHA_FAULT_HELD` file; continue the held
    processes as soon as this process has taken SIGINT or SIGTERM, the file is deleted, or HOLD_LIMIT_S passed."""
    from orchestration import signals

    main = threading.main_thread()
    path = os.environ.get(HELD_ENV)
    taken = signals.taken()
    deadline = time.monotonic() + HOLD_LIMIT_S
    said = False
    while time.monotonic() < deadline and signals.taken() == taken and not (said and path and not os.path.exists(path)):
        if not said and waiting(sys._current_frames().get(main.ident), WAITING_IN[phase]):
            say_held(phase, step, path)
            said = True
        time.sleep(0.01)
    if time.monotonic() >= deadline:
        log.error("%s: no signal within %.0f s of holding %s; continuing it", ENV, HOLD_LIMIT_S, phase)
    log.warning("%s: %s of step %d released", ENV, phase, step)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def say_held(phase: str, step: int, path: str | None) -> None:
    """Write "PHASE STEP" to the held file (aside and renamed: a watcher polling for it never reads it empty)."""
    if path:
        with open(f"{path}.part", "w") as f:
            f.write(f"{phase} {step}\n")
        os.replace(f"{path}.part", path)
    log.warning("%s: %s of step %d held until a signal arrives or %s is deleted", ENV, phase, step, path)


def hold_main_thread(phase: str, step: int) -> None:
    """A hold where the driver waits on nothing (between steps): keep the main thread here, in the phase, until a
    signal raises in it (Interrupted, out of this sleep), the held file is deleted, or HOLD_LIMIT_S passed."""
    path = os.environ.get(HELD_ENV)
    say_held(phase, step, path)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while time.monotonic() < deadline and not (path and not os.path.exists(path)):
        time.sleep(0.05)
    log.warning("%s: %s of step %d released", ENV, phase, step)


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
