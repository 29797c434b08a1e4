"""Fail in seconds when the Ray cluster cannot hold the run's actors, instead of waiting forever.

Ray queues an actor whose resources no node has and its autoscaler prints "No available node types can fulfill
resource request" every 35 s; the run never ends. Before any actor starts, `check_cluster_fits` compares what the
learner and the engine ask for (their `resources` sub-configs) with the cluster's alive nodes: the sums against
the cluster's totals, and each actor against the largest node (an actor's resources must all be on one node).
It checks the nodes there are now: a cluster that would autoscale new nodes in is refused too.
"""

from __future__ import annotations

import ray

from orchestration.config.schema import RunConfig
from rollout.server_process import LOOPBACK

# Ray resource name -> the key of `learner.resources` / `rollout.resources` that asks for it.
KEYS = {"CPU": "num_cpus", "GPU": "num_gpus", "TPU": "tpu"}
ACTORS = {"learner": "learner", "engine": "rollout", "judge engine": "judge_engine"}  # name in messages -> section
COUNTS = {"learner": ("hosts", "host"), "engine": ("replicas", "replica"),
          "judge engine": ("replicas", "replica")}  # how many actors of each, and its unit (judge_engine: always 1)
WHERE = {"CPU": "give the cluster more CPUs (ray.num_cpus for a local one)", "GPU": "run on a Ray node with GPUs",
         "TPU": "run on a TPU VM (its Ray node reports the chips as TPU)"}


class ResourceError(RuntimeError):
    """The cluster cannot hold the run's actors; the message is one line naming what is missing and the fix."""


def demands(cfg: RunConfig) -> dict[str, dict[str, float]]:
    """What each actor asks Ray for, by Ray resource name (zeros left out): one learner host, one engine replica."""
    out = {}
    for actor, section in ACTORS.items():
        if getattr(cfg, section) is None:  # no judge_engine
            continue
        r = getattr(cfg, section).resources
        out[actor] = {name: float(getattr(r, key)) for name, key in KEYS.items() if getattr(r, key) > 0}
        out[actor].update(r.custom)
    return out


def _key(name: str) -> str:
    """The resources key that asks for Ray resource `name` (`num_cpus`, or `custom.<name>`)."""
    return KEYS.get(name, f"custom.{name}")


def _where(name: str) -> str:
    return WHERE.get(name, f"start Ray on the nodes meant for it with --resources='{{\"{name}\": N}}'")


def counts(cfg: RunConfig) -> dict[str, int]:
    """How many actors of each kind the run starts (learner.hosts, rollout.replicas, one judge engine)."""
    return {actor: int(getattr(getattr(cfg, section), COUNTS[actor][0], 1)) for actor, section in ACTORS.items()
            if getattr(cfg, section) is not None}


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def shortfall(asks: dict[str, dict[str, float]], nodes: list[dict[str, float]],
              n_actors: dict[str, int] | None = None) -> str | None:
    """Why `asks` (per actor, `n_actors` of each) cannot be placed on `nodes` (alive nodes' resources); None if it fits."""
    n_actors = n_actors or {}
    times = lambda actor: (f" x {n_actors[actor]} {COUNTS[actor][0]}" if n_actors.get(actor, 1) > 1 else "")
    names = [*KEYS, *sorted({name for a in asks.values() for name in a} - set(KEYS))]
    for name in names:
        total = sum(a.get(name, 0.0) * n_actors.get(actor, 1) for actor, a in asks.items())
        have = sum(n.get(name, 0.0) for n in nodes)
        if total > have:
            parts = [f"{actor} {name}: {_n(a[name])}{times(actor)}" for actor, a in asks.items() if a.get(name)]
            who = parts[0].replace(" ", " asks ", 1) + "".join(f" and the {p}" for p in parts[1:])
            keys = " and ".join(f"{ACTORS[actor]}.resources.{_key(name)}" for actor, a in asks.items() if a.get(name))
            return f"{who}; this cluster has {name}: {_n(have)}; {_where(name)}, or lower {keys}"
    for actor, a in asks.items():
        for name, amount in a.items():
            largest = max((n.get(name, 0.0) for n in nodes), default=0.0)
            if amount > largest:
                return (f"the {actor} asks {name}: {_n(amount)} on one node, but the largest node has {name}: "
                        f"{_n(largest)}; lower {ACTORS[actor]}.resources.{_key(name)} to {_n(largest)} or less")
    return None


def check_cluster_fits(cfg: RunConfig) -> None:
    """Raise ResourceError (one line) when the connected Ray cluster cannot hold the learner and the engine, or
    when an engine pinned to loopback could land on a node the driver cannot reach."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if why := shortfall(demands(cfg), nodes, counts(cfg)):
        raise ResourceError(why)
    host = cfg.rollout.backend.host
    if len(nodes) > 1 and host in LOOPBACK:
        raise ResourceError(f"rollout.backend.host is {host} (loopback) on a Ray cluster of {len(nodes)} nodes: an "
                            "engine on another node than the driver's would be unreachable; leave "
                            "rollout.backend.host unset (each engine then binds its own node's address)")
