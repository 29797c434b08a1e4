"""Where the parts that take accelerators run: the learner's hosts and the engine replicas' chip groups.

Placement is the driver's decision, so it lives here rather than in the parts: `learner.group` and `rollout.fleet`
receive a ready placement group (or None) and only put their actors on its bundles, one bundle per learner process
or engine replica. On CPU there is nothing to place (the actors are local processes) and no group is made.

- A learner on several TPU hosts runs one JAX program over their chips, so its hosts must be ICI neighbours that
  form a valid slice topology (`learner.topology`). Ray's `subslice_placement_group` (ray/util/tpu.py:2162, Ray
  2.60) reserves exactly that inside a larger slice, from the chip coordinates it discovers once per slice; a learner
  whose topology is the whole slice takes every host of one slice (the same bundles on the slice's nodes, selected by
  its `ray.io/tpu-slice-name` label, which is what `SlicePlacementGroup` asks Ray for). STRICT_SPREAD alone would
  give any distinct hosts, of any slice. Ray orders those bundles by the hosts' worker numbers, which need not be
  their places in the slice; libtpu numbers a cluster's processes by place (orchestration/cluster/tpu_layout.py),
  and a learner process's `jax.distributed` id (its bundle index, learner/group.py) should be that task id, as on a
  slice JAX sets up itself (jax/_src/clusters/cloud_tpu_cluster.py:200-201 takes both from the host's worker
  number). So the driver reads each placed host's chip coordinates (`host_chip_coords`) and, when the bundle order
  is not the task order, reserves the same hosts again in task order (`_in_task_order`): bundle i is task i.
- A learner on several GPU hosts: STRICT_SPREAD, one process per host.
- Engine replicas: PACK. Each replica is its own single-host engine, so a host's chips may hold several replicas'
  groups (two 4-chip replicas on one v5e-8 host); under STRICT_SPREAD those could never be placed, and a run waited
  PLACEMENT_TIMEOUT_S and failed.
"""

from __future__ import annotations

import json

import ray
from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestration.cluster.tpu_env import Topology
from orchestration.cluster.tpu_layout import layout, one_host_shape, ray_worker_coords

PLACEMENT_TIMEOUT_S = 600
SLICE_NAME = "ray.io/tpu-slice-name"
SLICE_TOPOLOGY = "ray.io/tpu-topology"
WORKER_ID = "ray.io/tpu-worker-id"
"""The node labels Ray's TPU code reads (`ray._raylet.RAY_NODE_TPU_SLICE_NAME_KEY` / `..._TOPOLOGY_KEY` /
`..._WORKER_ID_KEY`)."""
SUBSLICE_KV_NAMESPACE = "tpu_subslice"
"""Where Ray 2.60.0 keeps a slice's discovered sub-slice labels (ray/util/tpu.py:1270, 1283-1285)."""


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
    return reserve_tpu_hosts(cfg.learner.topology, hosts, bundle)


def reserve_tpu_hosts(topology: str, hosts: int, bundle: dict[str, float]):
    """A ready group of `hosts` bundles on the hosts of one idle `topology` (sub-)slice, bundle i on task i."""
    needs = f"learner.hosts={hosts} needs the {hosts} hosts of an idle {topology} (sub-)slice, each with {bundle}"
    fix = "free those hosts or lower learner.hosts / learner.topology"
    pg = _ready(_tpu_slice_group(Topology.parse(topology), hosts, bundle), needs, fix)
    return _in_task_order(pg, bundle, needs, fix)


def _in_task_order(pg, bundle: dict[str, float], needs: str, fix: str):
    """`pg`, or the same hosts reserved again so that bundle i holds the host whose task id is i."""
    try:
        order = layout(host_chip_coords(pg)).in_task_order()
    except ValueError as err:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"{needs}: the placed hosts are not one slice of neighbours ({err}); {fix}") from None
    if order == sorted(order):
        return pg
    nodes = bundle_nodes(pg)
    ray.util.remove_placement_group(pg)
    pinned = placement_group([dict(bundle) for _ in order], strategy="STRICT_SPREAD", name="aha-learner",
                             bundle_label_selector=[{NODE_ID_LABEL_KEY: nodes[i]} for i in order])
    return _ready(pinned, needs, fix)


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


def bundle_nodes(pg) -> list[str]:
    """The node id of each bundle of a ready group, in bundle order."""
    table = ray.util.placement_group_table(pg)
    return [table["bundles_to_node_id"][i] for i in range(len(table["bundles"]))]


def bundle_hosts(pg) -> list[str]:
    """The node address of each bundle of a ready group, in bundle order."""
    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return [address[node] for node in bundle_nodes(pg)]


@ray.remote(num_cpus=0, max_calls=1)
def _sdk_chip_coords() -> list[list[int]] | None:
    """This host's chip coordinates from libtpu's SDK (the call Ray's sub-slice discovery makes, ray/util/tpu.py:1347);
    None where libtpu is not installed. One call per worker process, which then exits and holds nothing of libtpu."""
    try:
        from libtpu import sdk
    except ImportError:
        return None
    return [list(chip.coordinates()) for chip in sdk.slice.get_chip_coordinates()]


def host_chip_coords(pg) -> list[list]:
    """The chip coordinates of each bundle's host, in bundle order: libtpu's own answer on each host, else the
    coordinates Ray's worker table gives its place (`ray_table_coords`, no TPU: the test clusters)."""
    refs = [_sdk_chip_coords.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
            for i in range(len(bundle_nodes(pg)))]
    answers = ray.get(refs)
    if all(a is not None for a in answers):
        return answers
    return ray_table_coords(bundle_nodes(pg))


def ray_table_coords(node_ids: list[str]) -> list[list]:
    """Each node's chips as Ray's own table places it: its physical worker position (Ray's discovered one-host
    sub-slice index, else its worker number), turned into coordinates with Ray's (y, x) order honoured."""
    labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes()}
    coords = []
    for node in node_ids:
        own = labels[node]
        if not {SLICE_NAME, SLICE_TOPOLOGY, WORKER_ID} <= set(own):
            raise RuntimeError(f"node {node} has no TPU slice labels ({SLICE_NAME}, {SLICE_TOPOLOGY}, {WORKER_ID}) "
                               "and libtpu is not installed in its Python: its chips' places are unknown")
        topology, worker = own[SLICE_TOPOLOGY], own[WORKER_ID]
        stored = ray.experimental.internal_kv._internal_kv_get(f"tpu_subslice/{own[SLICE_NAME]}".encode(),
                                                               namespace=SUBSLICE_KV_NAMESPACE)
        discovered = json.loads(stored).get(worker, {}) if stored else {}
        place = discovered.get(f"ray.io/tpu-subslice-{one_host_shape(topology)}", worker)
        coords.append(ray_worker_coords(int(place), topology))
    return coords
