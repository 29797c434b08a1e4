"""The process grid of a multi-host learner's libtpu variables is the one libtpu itself lays out for its topology.

libtpu 0.0.50.1 (the sidecar setup installs; what preflight compiles with) describes a named topology without a TPU:
each device's chip coordinates (x, y, z) and the process that holds it. A learner on `learner.hosts` hosts must
describe the same thing in TPU_PROCESS_BOUNDS (hosts along x, y, z) and TPU_CHIPS_PER_PROCESS_BOUNDS (each host's
block of chips), or libtpu would build another slice than the one the step was compiled for. Runs in a subprocess,
as preflight does (no fake CPU devices, libtpu importable). Part of finding 4 of issue 27: on main no learner
process got any bounds (orchestration/cluster/tpu_env.py does not exist there).
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

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ["v5e:2x4", "v5e:4x4", "v5e:4x8", "v6e:4x4", "v4:2x2x2", "v4:2x2x4"]

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


def test_subslice_bounds_are_libtpus_layout():
    if not (libtpu_sidecar() / "libtpu").is_dir():
        pytest.fail(f"libtpu sidecar missing at {libtpu_sidecar()}: run `bash scripts/setup_envs.sh`")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    out = subprocess.run([sys.executable, "-c", LAYOUT, *TOPOLOGIES], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    layouts = json.loads(out.stdout.strip().splitlines()[-1])
    for name in TOPOLOGIES:
        topology = Topology.parse(name)
        hosts = topology.chips // 4
        [env0, *_] = learner_envs(name, hosts, 4, [f"10.0.0.{i}" for i in range(hosts)])
        ours = env0["TPU_PROCESS_BOUNDS"], env0["TPU_CHIPS_PER_PROCESS_BOUNDS"]
        assert ours == bounds_from_layout(layouts[name]), (name, ours)
