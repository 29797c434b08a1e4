"""A learner on several hosts behind one handle: N LearnerActors joined by `jax.distributed` into one mesh.

`learner.hosts: N` starts one actor per host of the learner's slice. Actor 0 picks the coordinator address (its
node, a free port) and every actor joins it, so one global mesh spans all processes' devices. Each call on the
handle runs the same method on every actor (multi-controller SPMD: each process runs the same step on its copy of
the batch, and the collectives inside the step need all of them) and answers with process 0's result.

The group looks like a LearnerActor handle to learner/handle.py: `group.call.remote("forward_backward", batch)` returns one
ObjectRef, so the learner handle, and the loop above it, do not know how many processes there are. That ref comes from a small zero-CPU task that
waits for all members: if one of them dies, the others would block in their next collective forever, so the task
kills the whole group at once and fails with one line saying so; the run then stops and `--resume` continues from
the last checkpoint (a multi-controller JAX program cannot go on without a member, nor re-admit one).

Placement: on TPU one bundle per learner host (`TPU` chips + CPUs) of a sub-slice, i.e. one process per host of
ICI neighbours, reserved by the driver (orchestration/cluster/placement.py) and passed in, with each process's environment
(its libtpu variables: the sub-slice's process grid, every member's address, its task id; orchestration/cluster/tpu_env.py).
On CPU the actors are local processes; each one's fake devices come from XLA_FLAGS in `runtime_env`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from learner.actor import start_learner_actor
from learner.config import LearnerConfig

log = logging.getLogger(__name__)

DEATH_NOTICE_S = 10.0  # how long a failed call waits for Ray to report a member's death before blaming the error
METHODS = ("call", "devices", "node")  # LearnerWorker's: `call` runs any learner primitive (learner/actor.py)


class LearnerProcessLost(RuntimeError):
    """A member of a multi-host learner died: the group cannot continue (resume from the last checkpoint)."""


@ray.remote(num_cpus=0, max_retries=0)
def _collect(method: str, refs: list, actors: list) -> Any:
    """Wait for every member's result; on the first failure kill the group and fail; else process 0's result."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except BaseException as err:
            # A dead member's peers may fail first (a collective's connection reset) or block forever: find the dead
            # one before killing the rest, so the error names the cause, not a symptom.
            died = isinstance(err, ray.exceptions.RayActorError)
            dead = [refs.index(done[0])] if died else _dead_members(refs)
            _kill(actors)
            if dead:
                raise LearnerProcessLost(
                    f"learner process {dead[0]} of {len(refs)} died during {method}: multi-controller JAX cannot go "
                    "on without every process, so the learner stopped; resume the run from its last checkpoint "
                    "with --resume RUN_DIR") from None
            raise
    return ray.get(refs[0])


def _dead_members(refs: list, timeout_s: float = DEATH_NOTICE_S) -> list[int]:
    """Indices of members whose call ended because their process died (waits briefly for Ray to notice)."""
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    dead = []
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            dead.append(refs.index(ref))
        except Exception:  # noqa: BLE001 - a member that failed otherwise is alive; only deaths are sought here
            pass
    return sorted(dead)


def _kill(actors: list) -> None:
    for actor in actors:
        ray.kill(actor, no_restart=True)


class _GroupMethod:
    def __init__(self, group: LearnerGroup, name: str):
        self._group, self._name = group, name

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Run the method on every process; one ref to process 0's result (fails if any member fails)."""
        # Put large arguments (the batch) in the object store once, not once per member.
        # An ObjectRef (another call's result) stays one: Ray resolves it for each member.
        args = tuple(a if isinstance(a, (int, float, str, type(None), ray.ObjectRef)) else ray.put(a) for a in args)
        refs = [getattr(a, self._name).remote(*args, **kwargs) for a in self._group.actors]
        return _collect.remote(self._name, refs, self._group.actors)


class LearnerGroup:
    """N learner processes behind the methods of one LearnerActor handle (`.call.remote(name, *args)` etc.)."""

    def __init__(self, actors: list, pg: Any = None):
        self.actors = actors
        self._pg = pg

    def __getattr__(self, name: str) -> _GroupMethod:
        if name in METHODS:
            return _GroupMethod(self, name)
        raise AttributeError(f"LearnerGroup has no method {name!r}; it forwards {METHODS}")

    def kill(self) -> None:
        """Stop every process and release the placement group; idempotent."""
        _kill(self.actors)
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None


def with_env(options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Ray options whose runtime_env also sets `env` (over the env_vars already there)."""
    if not env:
        return options
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
    return {**options, "runtime_env": runtime_env}


def start_learner(cfg: LearnerConfig, model_path: Path, checkpoint_dir: str | None = None,
                  actor_options: dict[str, Any] | None = None, placement: Any = None,
                  process_env: list[dict[str, str]] | None = None):
    """The learner as the driver sees it: one LearnerActor (hosts=1) or a LearnerGroup of `cfg.hosts` processes.

    `actor_options`: each process's Ray options (resources, runtime_env), from the driver. `placement`: a ready
    placement group with one bundle per host (the driver reserves it), or None (local processes). `process_env`:
    process i's own environment variables (set before it imports JAX), or None.

    Returns at once; the processes connect and load the model in the background (calls queue behind that).
    """
    envs = process_env or [{} for _ in range(cfg.hosts)]
    if cfg.hosts == 1:
        return start_learner_actor(cfg, model_path, checkpoint_dir, with_env(actor_options or {}, envs[0]))
    pg = placement
    actors = []
    for i in range(cfg.hosts):
        options = with_env(dict(actor_options or {}), envs[i])
        if pg is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
        actors.append(start_learner_actor(cfg, model_path, checkpoint_dir, options, num_processes=cfg.hosts))
    coordinator = ray.get(actors[0].coordinator_address.remote())
    for i, actor in enumerate(actors):
        actor.join.remote(coordinator, cfg.hosts, i)  # failures surface in the first call's _collect
    log.info("learner: %d processes, jax.distributed coordinator %s", cfg.hosts, coordinator)
    return LearnerGroup(actors, pg)

