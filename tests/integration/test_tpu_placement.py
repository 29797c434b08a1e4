"""Placement and each TPU process's environment, on a private Ray cluster whose nodes look like TPU hosts.

One module-scoped cluster of raylets on this machine (Ray's own `ray.cluster_utils.Cluster`): a v5e-8 VM (8 `TPU`,
8 CPUs; the head) and a 4-host v5e-16 slice (4 `TPU` and 2 CPUs each), with the node labels and head resource Ray's TPU code
reads on a real slice (ray/_private/accelerators/tpu.py:1024-1059 `get_current_node_accelerator_labels`,
982-1022 `get_current_node_additional_resources`). The probes are plain actors started with exactly the Ray options
and environment the driver computes (orchestration/cluster/launch.py, placement.py); each reports what its process (and an
engine process it would launch) sees. What cannot run here: libtpu on a chip. Ray's sub-slice discovery reads every
host's chip coordinates through libtpu (ray/util/tpu.py:1325-1353); the fixture stores what it persists (tpu.py:
1487-1527, labels from Ray's own `_build_subslice_labels`) for a slice whose workers 0 and 1 sit in each other's
places (`PLACES`): Ray keys its labels by worker number because the two need not agree, and the learner's task ids
must follow the places. Without libtpu's SDK on the hosts, the driver reads those places back from Ray's table.

Findings 3 and 4 of issue 27 fail here on main: no process got a port or bounds of its own, and two replicas could
not share one host's chips (STRICT_SPREAD: the run waited 600 s and failed, as the last lines of
`test_two_replicas_share_one_hosts_chips` show for that strategy on this cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from learner.group import with_env as learner_with_env
from orchestration.cluster import placement
from orchestration.cluster.launch import engine_replica_env, learner_process_env, learner_runtime_env
from orchestration.cluster.tpu_layout import neighbours
from orchestration.config.files import load_config
from rollout.fleet import with_env as engine_with_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
V5E8 = ROOT / "configs" / "countdown_qwen2.5-1.5b_tpu_v5e8.yaml"
V5E16 = ROOT / "configs" / "countdown_qwen2.5-7b_tpu_v5e16.yaml"
GEMMA = ROOT / "configs" / "math_gemma3-1b_tpu_2hosts.yaml"
SLICE = "aha-test-v5e16"
VM = "aha-test-v5e8"
PLACES = {0: 1, 1: 0, 2: 2, 3: 3}
"""Worker number -> physical place (Ray's worker order) in the fake v5e-16: workers 0 and 1 swapped."""


def tpu_labels(name: str, worker: int, topology: str, pod_type: str) -> dict[str, str]:
    return {"ray.io/tpu-slice-name": name, "ray.io/tpu-worker-id": str(worker), "ray.io/tpu-topology": topology,
            "ray.io/tpu-pod-type": pod_type}


@pytest.fixture(scope="module")
def tpu_cluster():
    from ray._private import utils as ray_utils
    from ray._private.accelerators.tpu import _build_subslice_labels
    from ray.cluster_utils import Cluster

    # Cluster() records its address in /tmp/ray for a bare ray.init() to find: not on a shared box. Its nodes take
    # the address Ray picks for this machine, as `ray.init(address="local")` does (Ray resolves a loopback
    # bootstrap address to it, so a driver could not join a GCS bound to 127.0.0.1).
    write_address, ray_utils.write_ray_address = ray_utils.write_ray_address, lambda *a, **k: None
    temp_dir = tempfile.mkdtemp(prefix="aha-tpu-", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    common = {"temp_dir": temp_dir}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "num_cpus": 8, "include_dashboard": False, "resources": {"TPU": 8, "TPU-v5litepod-8-head": 1},
        "labels": tpu_labels(VM, 0, "2x4", "v5litepod-8")})
    try:
        for w in range(4):
            cluster.add_node(**common, num_cpus=2, resources={"TPU": 4, **({"TPU-v5litepod-16-head": 1} if w == 0
                                                                            else {})},
                             labels=tpu_labels(SLICE, w, "4x4", "v5litepod-16"))
        ray.init(address=cluster.address, log_to_driver=False)
        discovered = {str(w): _build_subslice_labels(PLACES[w], "4x4") for w in range(4)}
        ray.experimental.internal_kv._internal_kv_put(f"tpu_subslice/{SLICE}".encode(),
                                                      json.dumps(discovered).encode(), namespace="tpu_subslice")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        ray_utils.write_ray_address = write_address
        shutil.rmtree(temp_dir, ignore_errors=True)


@ray.remote
class Probe:
    """Reports the TPU variables of its process, and of the engine process a RolloutServer here would launch."""

    def env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k.startswith(("TPU_", "CLOUD_TPU"))}

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def engine_env(self, backend: dict) -> dict[str, str]:
        from rollout.config import VllmConfig
        from rollout.vllm_server import VllmBackend

        env = VllmBackend(VllmConfig(**backend), Path("/model")).environment()
        return {k: v for k, v in env.items() if k.startswith(("TPU_", "CLOUD_TPU")) or k == "MODEL_IMPL_TYPE"}


def in_bundle(options: dict, pg, i: int) -> dict:
    return {**options, "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)}


def learner_probes(cfg, pg) -> list:
    """Probes started as learner.group starts the learner's processes (options, env, bundle)."""
    options = cfg.learner.resources.ray_options() | {"runtime_env": learner_runtime_env(cfg)}
    probes = []
    for i, env in enumerate(learner_process_env(cfg, pg)):
        opts = learner_with_env(options, env)
        probes.append(Probe.options(**(in_bundle(opts, pg, i) if pg is not None else opts)).remote())
    return probes


def engine_probes(cfg, pg) -> list:
    """Probes started as rollout.fleet starts the engine replicas' server actors."""
    options = cfg.rollout.resources.ray_options()
    return [Probe.options(**(in_bundle(engine_with_env(options, env), pg, i) if pg is not None else
                             engine_with_env(options, env))).remote()
            for i, env in enumerate(engine_replica_env(cfg))]


def node_labels() -> dict[str, dict[str, str]]:
    return {n["NodeID"]: n["Labels"] for n in ray.nodes() if n["Alive"]}


def release(actors: list, *groups) -> None:
    for actor in actors:
        ray.kill(actor)
    for pg in groups:
        if pg is not None:
            remove_placement_group(pg)


def test_split_host_learner_and_engine_each_run_their_own_libtpu(tpu_cluster):
    """configs/countdown_qwen2.5-1.5b_tpu_v5e8.yaml on one v5e-8 host: the learner (4 chips) and vllm-tpu (4 chips)
    get disjoint chips from Ray and each its own port, bounds and address (a half of a v5e-8: 1,4,1 first, what ran on
    hardware; tests/unit/test_tpu_layout.py); the engine process inherits its actor's and takes tpu-inference's LoRA-capable model path."""
    cfg = load_config(V5E8)
    [learner], [engine] = learner_probes(cfg, None), engine_probes(cfg, None)
    try:
        got_learner, got_engine = ray.get([learner.env.remote(), engine.env.remote()], timeout=120)
        engine_process = ray.get(engine.engine_env.remote(cfg.rollout.backend.model_dump()), timeout=60)
        assert ray.get(learner.node.remote()) == ray.get(engine.node.remote())  # one host, as on the v5e-8 VM
    finally:
        release([learner, engine])
    chips = [set(env["TPU_VISIBLE_CHIPS"].split(",")) for env in (got_learner, got_engine)]
    assert len(chips[0]) == len(chips[1]) == 4 and not chips[0] & chips[1]
    assert got_learner["TPU_PROCESS_PORT"] != got_engine["TPU_PROCESS_PORT"]
    for env in (got_learner, got_engine):
        assert (env["TPU_CHIPS_PER_PROCESS_BOUNDS"], env["TPU_PROCESS_BOUNDS"], env["CLOUD_TPU_TASK_ID"]) == \
            ("1,4,1", "1,1,1", "0")
        assert env["TPU_PROCESS_ADDRESSES"] == f"localhost:{env['TPU_PROCESS_PORT']}"
    assert engine_process == got_engine | {"MODEL_IMPL_TYPE": "vllm"}


def test_two_replicas_share_one_hosts_chips(tpu_cluster):
    """configs/math_gemma3-1b_tpu_2hosts.yaml: two 4-chip engine replicas on the one host whose CPUs and chips hold
    both. PACK places them; STRICT_SPREAD (main's strategy) cannot, here or on the TPU VM."""
    cfg = load_config(GEMMA)
    pg = placement.reserve_engines(cfg)
    probes = engine_probes(cfg, pg)
    try:
        envs = ray.get([p.env.remote() for p in probes], timeout=120)
        nodes = set(ray.get([p.node.remote() for p in probes]))
    finally:
        release(probes, pg)
    assert len(nodes) == 1 and node_labels()[nodes.pop()]["ray.io/tpu-slice-name"] == VM
    assert not set(envs[0]["TPU_VISIBLE_CHIPS"].split(",")) & set(envs[1]["TPU_VISIBLE_CHIPS"].split(","))
    assert envs[0]["TPU_PROCESS_PORT"] != envs[1]["TPU_PROCESS_PORT"]
    spread = placement_group([{"CPU": 4, "TPU": 4}] * 2, strategy="STRICT_SPREAD")
    try:
        ready, _ = ray.wait([spread.ready()], timeout=10)
        assert not ready, "STRICT_SPREAD placed two 4-CPU replicas on two hosts: the cluster is not as built"
    finally:
        remove_placement_group(spread)


def test_learner_takes_a_subslice_and_engines_other_chips(tpu_cluster):
    """configs/countdown_qwen2.5-7b_tpu_v5e16.yaml: the learner's 2 processes on the 2 hosts of one 2x4 sub-slice
    of the v5e-16 (Ray's SubslicePlacementGroup), joined as one libtpu cluster; the 2 engine replicas elsewhere,
    each its own. Ray's sub-slice 2x4 #0 is the hosts at places 0 and 1, side by side along x (Ray's own test
    coordinates: tests/unit/test_tpu_layout.py), and process i must be the host at place i.

    Fails on main at 85b20f9: there process 0 ran on worker 0 (Ray's bundle order, place 1) with task id 0, and the
    two were declared neighbours along y (TPU_PROCESS_BOUNDS=1,2,1)."""
    cfg = load_config(V5E16, ["learner.resources.num_cpus=1", "rollout.resources.num_cpus=1"])
    pg = placement.reserve_learner(cfg)
    learners = learner_probes(cfg, pg)
    engines_pg = placement.reserve_engines(cfg)
    engines = engine_probes(cfg, engines_pg)
    try:
        learner_envs = ray.get([p.env.remote() for p in learners], timeout=120)
        learner_nodes = ray.get([p.node.remote() for p in learners])
        engine_envs = ray.get([p.env.remote() for p in engines], timeout=120)
        engine_nodes = ray.get([p.node.remote() for p in engines])
    finally:
        release(learners + engines, pg, engines_pg)
    labels = node_labels()
    places = [PLACES[int(labels[n]["ray.io/tpu-worker-id"])] for n in learner_nodes]
    assert {labels[n]["ray.io/tpu-slice-name"] for n in learner_nodes} == {SLICE}
    assert places in ([0, 1], [2, 3]), places  # process i at the i-th place of its sub-slice, whatever Ray's order
    assert [e["CLOUD_TPU_TASK_ID"] for e in learner_envs] == ["0", "1"]
    ip = ray.util.get_node_ip_address()  # every node of this cluster has the machine's address
    assert {e["TPU_PROCESS_ADDRESSES"] for e in learner_envs} == {f"{ip}:8476,{ip}:8477"}
    assert {e["TPU_CHIPS_PER_PROCESS_BOUNDS"] for e in learner_envs} == {"2,2,1"}
    [grid] = {tuple(int(v) for v in e["TPU_PROCESS_BOUNDS"].split(",")) for e in learner_envs}
    assert neighbours(grid, (0, 1)) == "x", grid  # the two hosts are declared neighbours along x
    assert not set(engine_nodes) & set(learner_nodes)
    assert [e["TPU_PROCESS_PORT"] for e in engine_envs] == ["8478", "8479"]
    assert {e["TPU_PROCESS_BOUNDS"] for e in engine_envs} == {"1,1,1"}
    # The GKE plugin's variables (orchestration/cluster/tpu_gke.py): the learner's for its 4x2 sub-slice (Ray's "2x4"),
    # each engine's for its one whole host, so no libtpu reads the 4-host slice from the VM's metadata.
    assert {(e["TPU_SKIP_MDS_QUERY"], e["TPU_TOPOLOGY"], e["TPU_ACCELERATOR_TYPE"], e["TPU_HOST_BOUNDS"])
            for e in learner_envs} == {("true", "4x2", "v5litepod-8", "2,1,1")}
    assert [e["TPU_WORKER_ID"] for e in learner_envs] == ["0", "1"]
    assert {e["TPU_WORKER_HOSTNAMES"] for e in learner_envs} == {f"{ip},{ip}"}
    assert {(e["TPU_SKIP_MDS_QUERY"], e["TPU_TOPOLOGY"], e["TPU_ACCELERATOR_TYPE"], e["TPU_WORKER_HOSTNAMES"])
            for e in engine_envs} == {("true", "2x2", "v5litepod-4", "localhost")}


def test_learner_on_a_whole_slice_takes_its_hosts(tpu_cluster):
    """A learner whose topology is the whole v5e-16 (4 hosts): every host of that slice, by its slice-name label."""
    cfg = load_config(V5E16, ["learner.hosts=4", "learner.topology=v5e:4x4", "learner.resources.num_cpus=1",
                              "learner.mesh.axis_sizes=[16, 1]"])
    pg = placement.reserve_learner(cfg)
    try:
        hosts = placement.bundle_hosts(pg)
        nodes = placement.bundle_nodes(pg)
    finally:
        release([], pg)
    labels = node_labels()
    assert hosts == [ray.util.get_node_ip_address()] * 4
    assert [PLACES[int(labels[n]["ray.io/tpu-worker-id"])] for n in nodes] == [0, 1, 2, 3]  # bundle i: place i
