"""The GKE TPU device plugin's variables (orchestration/cluster/tpu_gke.py) against the plugin's own test table.

GoogleCloudPlatform's tpu-device-plugin, pkg/util `TestInitEnvs`: for a node's accelerator label, topology and chip
count, the variables its `InitEnvs` gives a container. The rows below are copied from that table (the keys aha sets;
the plugin's unprefixed duplicates HOST_BOUNDS / WRAP / ALT, its metrics ports and its vbar socket are not set here).
A row of one host is what an engine on a whole 4-chip host of a slice gets (`isolated_env`); a row of several hosts
is what a sub-slice learner's processes get (`slice_env`, worker ids and hostnames from the task order). Fails on main
at 98997ee: no TPU process got any of these variables there (tpu_gke.py does not exist).
"""

from __future__ import annotations

import pytest

from orchestration.cluster import tpu_env
from orchestration.cluster.tpu_env import Topology, isolated_env, learner_envs
from orchestration.cluster.tpu_gke import slice_env

# (generation, topology, chips per node) -> the plugin's TestInitEnvs `want` (keys aha sets).
PLUGIN_TABLE = {
    ("v5e", "2x2", 4): {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_TOPOLOGY": "2x2",
                        "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                        "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_WORKER_ID": "0",
                        "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "true"},
    ("v5e", "2x4", 4): {"TPU_ACCELERATOR_TYPE": "v5litepod-8", "TPU_TOPOLOGY": "2x4",
                        "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                        "TPU_HOST_BOUNDS": "1,2,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_SKIP_MDS_QUERY": "true"},
    ("v5e", "4x4", 4): {"TPU_ACCELERATOR_TYPE": "v5litepod-16", "TPU_TOPOLOGY": "4x4",
                        "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                        "TPU_HOST_BOUNDS": "2,2,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_SKIP_MDS_QUERY": "true"},
    ("v5e", "8x16", 4): {"TPU_ACCELERATOR_TYPE": "v5litepod-128", "TPU_TOPOLOGY": "8x16",
                         "TPU_TOPOLOGY_WRAP": "false,true,false", "TPU_TOPOLOGY_ALT": "false",
                         "TPU_HOST_BOUNDS": "4,8,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_SKIP_MDS_QUERY": "true"},
    ("v5e", "16x16", 4): {"TPU_ACCELERATOR_TYPE": "v5litepod-256", "TPU_TOPOLOGY": "16x16",
                          "TPU_TOPOLOGY_WRAP": "true,true,false", "TPU_TOPOLOGY_ALT": "false",
                          "TPU_HOST_BOUNDS": "8,8,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
                          "TPU_SKIP_MDS_QUERY": "true"},
    ("v6e", "2x2", 4): {"TPU_ACCELERATOR_TYPE": "v6e-4", "TPU_TOPOLOGY": "2x2",
                        "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                        "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_WORKER_ID": "0",
                        "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "true"},
    ("v6e", "4x4", 4): {"TPU_ACCELERATOR_TYPE": "v6e-16", "TPU_TOPOLOGY": "4x4",
                        "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                        "TPU_HOST_BOUNDS": "2,2,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_SKIP_MDS_QUERY": "true"},
    ("v4", "2x2x1", 4): {"TPU_ACCELERATOR_TYPE": "v4-8", "TPU_TOPOLOGY": "2x2x1",
                         "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                         "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_WORKER_ID": "0",
                         "TPU_WORKER_HOSTNAMES": "localhost", "TPU_SKIP_MDS_QUERY": "true"},
    ("v4", "2x2x2", 4): {"TPU_ACCELERATOR_TYPE": "v4-16", "TPU_TOPOLOGY": "2x2x2",
                         "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                         "TPU_HOST_BOUNDS": "1,1,2", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_SKIP_MDS_QUERY": "true"},
    ("v4", "4x4x4", 4): {"TPU_ACCELERATOR_TYPE": "v4-128", "TPU_TOPOLOGY": "4x4x4",
                         "TPU_TOPOLOGY_WRAP": "true,true,true", "TPU_TOPOLOGY_ALT": "false",
                         "TPU_HOST_BOUNDS": "2,2,4", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_SKIP_MDS_QUERY": "true"},
    ("v5p", "2x2x4", 4): {"TPU_ACCELERATOR_TYPE": "v5p-32", "TPU_TOPOLOGY": "2x2x4",
                          "TPU_TOPOLOGY_WRAP": "false,false,false", "TPU_TOPOLOGY_ALT": "false",
                          "TPU_HOST_BOUNDS": "1,1,4", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_SKIP_MDS_QUERY": "true"},
}
WORKER_KEYS = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES")
"""Set by the plugin for one host only; for several, by the workload's controller (tpu_gke.py)."""


@pytest.mark.parametrize("generation,topology,per_node", sorted(PLUGIN_TABLE), ids=lambda v: str(v))
def test_slice_variables_are_the_plugins(generation, topology, per_node):
    want = PLUGIN_TABLE[generation, topology, per_node]
    named = Topology.parse(f"{generation}:{topology}")
    hosts = 1 if named.chips == per_node else len(named.named_hosts())
    block = tpu_env.HOST_BLOCK[len(named.dims)]
    got = slice_env(generation, named.dims, block, len(named.dims), 0, ["localhost"] if hosts == 1 else
                    [f"10.0.0.{i}" for i in range(hosts)])
    if hosts > 1:
        got = {k: v for k, v in got.items() if k not in WORKER_KEYS}
    assert got == want


@pytest.mark.parametrize("generation,topology", [("v5e", "2x2"), ("v6e", "2x2"), ("v4", "2x2x1")])
def test_a_process_on_a_whole_4_chip_host_of_a_slice_gets_the_plugins_one_host_variables(generation, topology):
    """An engine replica of configs/countdown_qwen2.5-7b_tpu_v5e16.yaml holds one whole host of the 4-host slice:
    without TPU_SKIP_MDS_QUERY its libtpu reads the 4x4 slice from the VM's metadata and waits for 3 more hosts."""
    env = isolated_env(4, tpu_env.BASE_PORT, generation, host_chips=4)
    assert {k: env[k] for k in PLUGIN_TABLE[generation, topology, 4]} == PLUGIN_TABLE[generation, topology, 4]
    assert env["TPU_PROCESS_BOUNDS"] == "1,1,1" and env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"


def test_a_sub_slice_learner_gets_the_plugins_variables_for_its_own_sub_slice():
    """The plugin's `SubSliceTopology` row ("Subslicing 4x4 in v6e slice 16x16"): the sub-slice's shape and size, not
    the slice's. Here a 4-host v6e:4x4 learner placed on hosts given in reverse order: worker ids follow libtpu's
    task order, hostnames list the hosts in that order."""
    hosts = Topology.parse("v6e:4x4").named_hosts()[::-1]
    envs = learner_envs("v6e:4x4", 4, 4, [f"10.0.0.{i}" for i in range(4)], hosts)
    want = PLUGIN_TABLE["v6e", "4x4", 4]
    assert all({k: e[k] for k in want} == want for e in envs)
    assert [e["TPU_WORKER_ID"] for e in envs] == ["3", "2", "1", "0"]
    assert {e["TPU_WORKER_HOSTNAMES"] for e in envs} == {"10.0.0.3,10.0.0.2,10.0.0.1,10.0.0.0"}
