"""A multi-host learner's libtpu variables, from its hosts' chip coordinates, are the cluster libtpu itself lays out.

libtpu 0.0.50.1 (the sidecar setup installs; what preflight compiles with) describes a named topology without a TPU:
each device's chip coordinates (x, y, z) and the process that holds it. Given each process's chips as its host's
coordinates (in shuffled order, as Ray may place them), the learner's environments must describe the same cluster:
TPU_PROCESS_BOUNDS (hosts along x, y, z), TPU_CHIPS_PER_PROCESS_BOUNDS (each host's block) and each host's task id
equal to libtpu's own process index. Runs in a subprocess, as preflight does (no fake CPU devices, libtpu
importable). The task-id check fails on main at 85b20f9: task ids there were bundle order, whatever the chips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.cli.preflight import libtpu_sidecar
from orchestration.cluster.tpu_env import Topology, learner_envs
from orchestration.cluster.tpu_layout import ray_worker_coords

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ["v5e:2x4", "v5e:4x2", "v5e:4x4", "v5e:4x8", "v6e:4x2", "v6e:4x4", "v4:2x2x2", "v4:2x2x4"]
"""v5e:4x2 / v6e:4x2: the sub-slice Ray's "2x4" places (two hosts side by side along x), which the v5e-16 learner
gets and whose name the GKE variables carry; libtpu 0.0.50.1 describes it (2 processes of 2x2 chips along x)."""

LAYOUT = """
import json, sys
from orchestration.cli.preflight import use_libtpu
use_libtpu("v5e:2x2")
from jax.experimental import topologies
out = {}
for name in sys.argv[1:]:
    devices = topologies.get_topology_desc(topology_name=name, platform="tpu").devices
    out[name] = [[d.process_index, list(d.coords)] for d in devices]
print(json.dumps(out))
"""


def bounds_from_layout(layout: list) -> tuple[str, str]:
    """(process bounds, chips per process bounds) as libtpu lays the devices out."""
    chips: dict[int, set] = {}
    for process, coords in layout:
        chips.setdefault(process, set()).add(tuple(coords))
    blocks = {tuple(max(c[a] for c in cs) - min(c[a] for c in cs) + 1 for a in range(3)) for cs in chips.values()}
    assert len(blocks) == 1, blocks  # every host holds a block of the same shape
    [block] = blocks
    origins = [tuple(min(c[a] for c in cs) for a in range(3)) for cs in chips.values()]
    grid = tuple(len({o[a] for o in origins}) for a in range(3))
    return ",".join(map(str, grid)), ",".join(map(str, block))


@pytest.fixture(scope="module")
def layouts() -> dict:
    if not (libtpu_sidecar() / "libtpu").is_dir():
        pytest.fail(f"libtpu sidecar missing at {libtpu_sidecar()}: run `bash scripts/setup_envs.sh`")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    out = subprocess.run([sys.executable, "-c", LAYOUT, *TOPOLOGIES], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def by_process(layout: list) -> dict[int, list]:
    chips: dict[int, list] = {}
    for process, coords in layout:
        chips.setdefault(process, []).append(coords)
    return chips


def test_subslice_env_from_coordinates_is_libtpus_layout(layouts):
    for name in TOPOLOGIES:
        chips = by_process(layouts[name])
        processes = sorted(chips)[::-1]  # placed in the reverse of libtpu's order
        hosts = [chips[p] for p in processes]
        envs = learner_envs(name, len(hosts), 4, [f"10.0.0.{i}" for i in range(len(hosts))], hosts)
        assert [int(e["CLOUD_TPU_TASK_ID"]) for e in envs] == processes, name
        ours = envs[0]["TPU_PROCESS_BOUNDS"], envs[0]["TPU_CHIPS_PER_PROCESS_BOUNDS"]
        assert ours == bounds_from_layout(layouts[name]), (name, ours)
        # The name's own layout (what preflight shows) is libtpu's too (a v4 chip holds two devices: one chip).
        assert [set(map(tuple, h)) for h in Topology.parse(name).named_hosts()] == \
            [set(map(tuple, chips[p])) for p in sorted(chips)], name


def test_ray_reads_libtpus_own_layout_only_for_square_2d_slices(layouts):
    """Why placement asks libtpu's SDK for each host's coordinates before Ray's table: Ray 2.60.0's
    `_get_physical_worker_id_from_coords` (ray/_private/accelerators/tpu.py:358-429), given libtpu's own layout of a
    topology, numbers a square 2-D slice's hosts as libtpu does, puts both hosts of a v4:2x2x2 at worker 0, and
    finds v4:2x2x4's hosts 2 and 3 outside its grid. If the pinned Ray changes this, revisit tpu_layout.py."""
    from ray._private.accelerators import tpu as ray_tpu

    def ray_workers(name: str) -> list:
        shape, out = name.split(":")[1], []
        for _, coords in sorted(by_process(layouts[name]).items()):
            coords = [c[:2] for c in coords] if shape.count("x") == 1 else coords
            try:
                out.append(ray_tpu._get_physical_worker_id_from_coords(coords, shape))
            except ValueError:
                out.append(None)
        return out

    assert ray_workers("v5e:4x4") == ray_workers("v6e:4x4") == [0, 1, 2, 3]
    assert ray_workers("v4:2x2x2") == [0, 0]
    assert ray_workers("v4:2x2x4") == [0, 0, None, None]


def test_gke_variables_name_a_topology_libtpu_lays_out_as_the_hosts_are(layouts):
    """The GKE plugin's variables each sub-slice process gets (TPU_TOPOLOGY, TPU_HOST_BOUNDS, TPU_CHIPS_PER_HOST_BOUNDS,
    TPU_WORKER_ID; orchestration/cluster/tpu_gke.py) describe a slice libtpu itself lays out exactly as the placed
    hosts' chips are: the named topology is one libtpu accepts, its processes hold the hosts' chips (moved to the
    origin) and its process numbers are the worker ids. Checked for libtpu's own layouts and for the hosts Ray's "2x4"
    sub-slice of a v5e-16 gives the learner of configs/countdown_qwen2.5-7b_tpu_v5e16.yaml (TPU_TOPOLOGY 4x2). Fails
    on main at 98997ee: no process got TPU_TOPOLOGY there (KeyError), so libtpu read the 4-host slice's metadata."""
    cases = [(name, [chips for _, chips in sorted(by_process(layouts[name]).items())][::-1]) for name in TOPOLOGIES]
    cases.append(("v5e:2x4", [ray_worker_coords(w, "4x4") for w in (1, 0)]))  # the v5e-16 learner's, as Ray places it
    for topology, hosts in cases:
        generation = topology.split(":")[0]
        envs = learner_envs(topology, len(hosts), 4, [f"10.0.0.{i}" for i in range(len(hosts))], hosts)
        name = f"{generation}:{envs[0]['TPU_TOPOLOGY']}"
        assert name in layouts, (topology, name)
        libtpu = by_process(layouts[name])
        low = [min(c[a] for h in hosts for c in h) for a in range(len(hosts[0][0]))]
        for env, chips in zip(envs, hosts):
            mine = {tuple(c[a] - low[a] for a in range(len(c))) for c in chips}
            assert {tuple(c[:len(low)]) for c in libtpu[int(env["TPU_WORKER_ID"])]} == mine, (topology, env)
            assert env["TPU_WORKER_ID"] == env["CLOUD_TPU_TASK_ID"] and env["TPU_SKIP_MDS_QUERY"] == "true"
        assert (envs[0]["TPU_HOST_BOUNDS"], envs[0]["TPU_CHIPS_PER_HOST_BOUNDS"]) == bounds_from_layout(layouts[name])
