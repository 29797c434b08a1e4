"""Where the parts that take accelerators run: the learner's hosts and the engine replicas' chip groups.

Placement is the driver's decision, so it lives here rather than in the parts: `learner.group` and `rollout.fleet`
receive a ready placement group (or None) and only put their actors on its bundles, one bundle per learner process
or engine replica. On CPU there is nothing to place (the actors are local processes) and no group is made.

- A learner on several TPU hosts runs one JAX program over their chips, so its hosts must be ICI neighbours that
  form a valid slice topology (`learner.topology`). Ray's `subslice_placement_group` (ray/util/tpu.py:2162, Ray
  2.60) reserves exactly that inside a larger slice, from the chip coordinates it discovers once per slice; a learner
  whose topology is the whole slice takes every host of one slice (the same bundles on the slice's nodes, selected by
  its `ray.io/tpu-slice-name` label, which is what `SlicePlacementGroup` asks Ray for). STRICT_SPREAD alone would
  give any distinct hosts, of any slice.
- A learner on several GPU hosts: STRICT_SPREAD, one process per host.
- Engine replicas: PACK. Each replica is its own single-host engine, so a host's chips may hold several replicas'
  groups (two 4-chip replicas on one v5e-8 host); under STRICT_SPREAD those could never be placed, and a run waited
  PLACEMENT_TIMEOUT_S and failed.
"""

from __future__ import annotations

import ray
from ray.util.placement_group import placement_group

from orchestration.cluster.tpu_env import Topology

PLACEMENT_TIMEOUT_S = 600
SLICE_NAME = "ray.io/tpu-slice-name"
SLICE_TOPOLOGY = "ray.io/tpu-topology"
"""The node labels Ray's TPU code reads (`ray._raylet.RAY_NODE_TPU_SLICE_NAME_KEY` / `..._TOPOLOGY_KEY`)."""


def _bundle(r) -> dict[str, float]:
    return {"CPU": r.num_cpus, **({"TPU": r.tpu} if r.tpu else {}), **({"GPU": r.num_gpus} if r.num_gpus else {}),
            **r.custom}


def _ready(pg, needs: str, fix: str):
    """Wait for `pg`; on timeout remove it and raise one line saying what was needed and what to change."""
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"{needs}, not found in {PLACEMENT_TIMEOUT_S} s (cluster: {ray.cluster_resources()}); "
                           f"{fix}") from None
    return pg


def reserve_learner(cfg):
    """A ready group with one bundle per learner host (a TPU sub-slice or distinct GPU hosts), or None (one host)."""
    r, hosts = cfg.learner.resources, cfg.learner.hosts
    if hosts == 1 or not (r.tpu or r.num_gpus):
        return None
    bundle = _bundle(r)
    if not r.tpu:
        pg = placement_group([dict(bundle) for _ in range(hosts)], strategy="STRICT_SPREAD", name="aha-learner")
        return _ready(pg, f"learner.hosts={hosts} needs {hosts} distinct Ray nodes each with {bundle}",
                      "start Ray on every learner host or lower learner.hosts / learner.resources")
    return _ready(_tpu_slice_group(Topology.parse(cfg.learner.topology), hosts, bundle),
                  f"learner.hosts={hosts} needs the {hosts} hosts of an idle {cfg.learner.topology} (sub-)slice, "
                  f"each with {bundle}", "free those hosts or lower learner.hosts / learner.topology")


def _tpu_slice_group(topology: Topology, hosts: int, bundle: dict[str, float]):
    """Ray's sub-slice group for `topology`, or every host of one slice whose topology it is."""
    from ray.util.tpu import subslice_placement_group

    try:
        return subslice_placement_group(topology.shape, topology.ray_version, chips_per_vm=int(bundle["TPU"]),
                                        resources_per_bundle=bundle, strategy="STRICT_SPREAD",
                                        name="aha-learner").placement_group
    except ValueError as err:
        if "slice_placement_group" not in str(err):  # Ray's hint when the topology is a whole slice, not a part
            raise RuntimeError(_no_slice(topology, hosts, err)) from None
    except RuntimeError as err:  # every such sub-slice is busy, or libtpu is missing for the first discovery
        raise RuntimeError(_no_slice(topology, hosts, err)) from None
    names = sorted({n["Labels"][SLICE_NAME] for n in ray.nodes() if n.get("Alive") and
                    n.get("Labels", {}).get(SLICE_TOPOLOGY) == topology.shape and SLICE_NAME in n["Labels"]})
    if not names:
        raise RuntimeError(_no_slice(topology, hosts, ValueError("no node names its slice")))
    selector = {SLICE_NAME: names[0]}
    return placement_group([dict(bundle) for _ in range(hosts)], strategy="STRICT_SPREAD", name="aha-learner",
                           bundle_label_selector=[dict(selector) for _ in range(hosts)])


def _no_slice(topology: Topology, hosts: int, err: Exception) -> str:
    why = " ".join(str(err).split())
    return (f"learner.hosts={hosts} with learner.topology {topology.generation}:{topology.shape} needs a "
            f"{topology.shape} sub-slice of a Ray TPU slice ({why}); run Ray on a TPU slice's hosts, or set "
            "learner.topology to a part of one")


def reserve_engines(cfg):
    """A ready group with one bundle per engine replica (PACKed: replicas may share a host's chips), or None."""
    r, replicas = cfg.rollout.resources, cfg.rollout.replicas
    if replicas == 1 or not (r.tpu or r.num_gpus):
        return None
    bundle = _bundle(r)
    pg = placement_group([dict(bundle) for _ in range(replicas)], strategy="PACK", name="aha-rollout")
    return _ready(pg, f"rollout.replicas={replicas} needs {replicas} groups of {bundle} on the cluster's nodes",
                  "add hosts or lower rollout.replicas / rollout.resources")


def bundle_hosts(pg) -> list[str]:
    """The node address of each bundle of a ready group, in bundle order."""
    table = ray.util.placement_group_table(pg)
    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return [address[table["bundles_to_node_id"][i]] for i in range(len(table["bundles"]))]
