"""`aha tpu-check` and the run's first-psum choice of chip bounds on a Ray cluster that looks like TPU VMs.

A private cluster of raylets on this machine (Ray's own `ray.cluster_utils.Cluster`, as
tests/integration/test_tpu_placement.py builds it): a v5e-8 VM (8 `TPU`, the head) and a 4-host v5e-16 slice (4 `TPU`
each), with the resources, node labels and stored sub-slice labels Ray's TPU code reads on a real slice, so Ray
hands each probe its `TPU_VISIBLE_CHIPS` and places the slice rows' processes as on TPU hosts. Everything is the
real command (its rows, placement, Ray actors, the wait for a killed probe's process to be gone, a real 2-process
`jax.distributed` psum over 4 CPU devices per process) except the one thing that needs a chip: the probe's
`devices` reports what libtpu would (as many TPU devices as its chips, numbered from (0, 0, 0) in every process as
an isolated libtpu may), and a probe started with a variable listed in the fail file raises as a libtpu that
refuses it would.

Fails on main at 98997ee: there the two halves' equal coordinates were read as "chips overlap", so every half-host
row was FAILED and the check exited 1 on chips that work (the first test), and no row printed its variables.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, logging, os, shutil, sys, tempfile
import ray
from ray._private import utils as ray_utils
from ray._private.accelerators.tpu import _build_subslice_labels
from ray.cluster_utils import Cluster

from orchestration.cluster import tpu_probe

FAIL_FILE = os.environ["FAKE_TPU_FAIL_FILE"]


class FakeTpuProbe(tpu_probe.Probe.__ray_actor_class__):
    """The real probe, with libtpu's answers where a chip is needed."""

    def _refuse(self):
        for kv in open(FAIL_FILE).read().split():
            key, value = kv.split("=", 1)
            if os.environ.get(key) == value:
                raise RuntimeError(f"fake libtpu: refused {kv}")

    def devices(self):
        self._refuse()
        visible = os.environ.get("TPU_VISIBLE_CHIPS", "")
        count = len(visible.split(",")) if visible else int(ray.get_runtime_context().get_assigned_resources()["TPU"])
        return {"platform": "tpu", "kind": "TPU v5 lite", "count": count, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id(), "visible": visible,
                "coords": [(i % 2, i // 2, 0) for i in range(count)], "metrics": "8431 silent",
                "env": {k: v for k, v in os.environ.items() if k.startswith(tpu_probe.ENV_PREFIXES)}}

    def psum(self):
        self._refuse()
        return super().psum()


tpu_probe.Probe = ray.remote(max_restarts=0)(FakeTpuProbe)

labels = lambda name, w, topo, pod: {"ray.io/tpu-slice-name": name, "ray.io/tpu-worker-id": str(w),
                                     "ray.io/tpu-topology": topo, "ray.io/tpu-pod-type": pod}
ray_utils.write_ray_address = lambda *a, **k: None
temp_dir = tempfile.mkdtemp(prefix="aha-tpuck-", dir="/tmp")
kind = {"accelerator_type:TPU-V5LITEPOD": 1}
cluster = Cluster(initialize_head=True, head_node_args={
    "temp_dir": temp_dir, "num_cpus": 8, "include_dashboard": False,
    "resources": {"TPU": 8, "TPU-v5litepod-8-head": 1, **kind}, "labels": labels("vm", 0, "2x4", "v5litepod-8")})
try:
    for w in range(4):
        cluster.add_node(temp_dir=temp_dir, num_cpus=2, labels=labels("slice", w, "4x4", "v5litepod-16"),
                         resources={"TPU": 4, **kind, **({"TPU-v5litepod-16-head": 1} if w == 0 else {})})
    ray.init(address=cluster.address, log_to_driver=False)
    found = {str(w): _build_subslice_labels(w, "4x4") for w in range(4)}
    ray.experimental.internal_kv._internal_kv_put(b"tpu_subslice/slice", json.dumps(found).encode(),
                                                  namespace="tpu_subslice")
    ray.shutdown()
    from orchestration.cli import tpu_check
    for phase in sys.argv[1:]:
        fail = phase.split(":", 1)[1] if ":" in phase else ""
        open(FAIL_FILE, "w").write(fail)
        print(f"=== {phase}", flush=True)
        if phase.startswith("check"):
            print(f"exit code {tpu_check.main(['--address', cluster.address, '--timeout-s', '120'])}", flush=True)
        else:  # the run's own choice, as launch.start_learner makes it for a learner on half the v5e-8
            from orchestration.cluster.tpu_settle import settle_chip_bounds
            logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(message)s", force=True)
            ray.init(address=cluster.address, log_to_driver=False)
            try:
                chosen = settle_chip_bounds("v5e", 4, 8, {"num_cpus": 0, "resources": {"TPU": 4}}, 120)
            except RuntimeError as err:
                chosen = f"error: {err}"
            print(f"chosen {chosen}", flush=True)
            ray.shutdown()
finally:
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
'''


@pytest.fixture(scope="module")
def phases(tmp_path_factory) -> dict[str, str]:
    """One fake-TPU cluster, each phase's output: the check with every setting accepted, the check with a libtpu
    that refuses the slice's process grid, and the run's choice with a libtpu that refuses 1,4,1."""
    tmp = tmp_path_factory.mktemp("fake-tpu")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith(("TPU_", "CLOUD_TPU"))} | {
        "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "FAKE_TPU_FAIL_FILE": str(tmp / "fail"),
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}  # a CPU process holds as many devices as a host
    names = ["check", "check:TPU_PROCESS_BOUNDS=2,1,1", "settle:TPU_CHIPS_PER_PROCESS_BOUNDS=1,4,1"]
    out = subprocess.run([sys.executable, "-c", SCRIPT, *names], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    parts = ("\n" + out.stdout).split("\n=== ")
    return {name: next(p for p in parts if p.startswith(name + "\n")) for name in names}


def rows_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("devices:", "engine:", "slice:"))]


def test_check_prints_the_table_with_variables_and_exits_0_when_a_setting_per_check_works(phases):
    text = phases["check"]
    assert "exit code 0" in text, text
    rows = rows_of(text)
    halves = [r for r in rows if r.startswith("devices: 2 processes x 4 chips")]
    assert [re.split(r"\s{2,}", r)[1] for r in halves] == ["aha 1: 1,4,1", "aha 2: 2,2,1", "Ray alone: chips only"]
    assert all("  ok  " in r for r in halves), text  # equal coordinates in both processes: not an overlap
    assert "chips 0,1,2,3" in halves[0] and "chips 4,5,6,7" in halves[0] or \
        "chips 4,5,6,7" in halves[0] and "chips 0,1,2,3" in halves[0], halves[0]
    lines = text.splitlines()
    first = lines.index(halves[0])
    assert "TPU_CHIPS_PER_PROCESS_BOUNDS=1,4,1" in lines[first + 1] and lines[first + 1].count(" | ") == 1
    psums = [r for r in rows if r.startswith("slice: 2-process jax.distributed psum")]
    assert len(psums) == 2 and all("  ok  " in r and "psum [8.0, 8.0] over 8 devices" in r for r in psums), text
    [coords] = [r for r in rows if r.startswith("slice: 2 learner hosts' chips")]
    assert "TPU_SKIP_MDS_QUERY=true" in lines[lines.index(coords) + 1]  # what the run sets (the probes' jax, finding
    # no chip here, rewrites it to 1: jax/_src/cloud_tpu_init.py)
    gke = lines[lines.index(psums[0]) + 1]
    for variable in ("TPU_TOPOLOGY=4x2", "TPU_ACCELERATOR_TYPE=v5litepod-8", "TPU_PROCESS_BOUNDS=2,1,1",
                     "TPU_WORKER_ID=0", "TPU_WORKER_ID=1", "TPU_HOST_BOUNDS=2,1,1"):
        assert variable in gke, gke
    assert "TPU_TOPOLOGY=" not in lines[lines.index(psums[1]) + 1]
    assert "every check that ran has a setting that works" in text


def test_check_exits_1_naming_the_variables_when_no_setting_of_a_check_works(phases):
    text = phases["check:TPU_PROCESS_BOUNDS=2,1,1"]
    assert "exit code 1" in text, text
    failed = [line for line in text.splitlines() if line.startswith("tpu-check: FAILED")]
    assert failed == ["tpu-check: FAILED slice: 2-process jax.distributed psum: no setting worked; tried:"], text
    tried = text.split(failed[0], 1)[1]
    assert "TPU_PROCESS_BOUNDS=2,1,1" in tried and "fake libtpu: refused TPU_PROCESS_BOUNDS=2,1,1" in tried, tried
    assert all("  ok  " in r for r in rows_of(text) if r.startswith("devices:")), text


def test_the_run_takes_the_next_setting_when_the_first_psum_fails_and_logs_it(phases):
    """What launch.start_learner does before a learner on half a v5e-8 starts: 1,4,1's psum fails here, 2,2,1's
    works, and the run's log says so."""
    text = phases["settle:TPU_CHIPS_PER_PROCESS_BOUNDS=1,4,1"]
    assert "chosen 2,2,1" in text, text
    assert "LOG TPU chip bounds for a process on 4 of a host's 8 chips: 2,2,1" in text, text
    assert "failed before it: 1,4,1" in text, text
