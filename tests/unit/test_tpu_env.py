"""Each TPU process's libtpu variables (orchestration/cluster/tpu_env.py), against the rules of the code that reads them.

- Ray 2.60 (installed here): what it sets itself for a sub-host share (ray/_private/accelerators/tpu.py:826-874),
  its chip counts and its multi-host worker grids (tpu.py:23, 60, 132-160);
- tpu-inference 0.32.0 (the engine we pin; its wheel's source, not installed here): the isolation of runtimes that
  share a host, `TPUWorker._setup_dp_chip_isolation` (tpu_inference/worker/tpu_worker.py:298-305), copied below as
  the table the isolated environment must equal;
- libtpu's own layout of a multi-host topology: tests/integration/test_tpu_env_topology.py.

Finding 3 of issue 27 (on main, only Ray's TPU_VISIBLE_CHIPS reached a process, and the learner actor could take no
extra variables) fails here on main: orchestration/cluster/tpu_env.py and `learner.env` do not exist there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ray._private.accelerators import tpu as ray_tpu

from orchestration.cluster import tpu_env
from orchestration.cluster.launch import engine_replica_env, learner_process_env, learner_runtime_env
from orchestration.config.files import load_config
from orchestration.cluster.tpu_env import Topology, engine_envs, isolated_env, learner_envs, subslice_env
from orchestration.cluster.tpu_layout import layout

ROOT = Path(__file__).resolve().parents[2]
V5E8 = ROOT / "configs" / "countdown_qwen2.5-1.5b_tpu_v5e8.yaml"
V5E16 = ROOT / "configs" / "countdown_qwen2.5-7b_tpu_v5e16.yaml"
TPU_KEYS = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS", "TPU_PROCESS_PORT",
            "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")


def tpu_inference_dp_isolation(chips_per_rank: int, dp_rank: int) -> dict[str, str]:
    """tpu-inference 0.32.0 tpu_inference/worker/tpu_worker.py:295-305, its variables for one of several runtimes
    on a host (BASE_TPU_PROCESS_PORT = 8476, distributed/jax_parallel_state.py:28), without the chip list (Ray's)."""
    tpu_port = 8476 + dp_rank
    return {"TPU_CHIPS_PER_PROCESS_BOUNDS": f"1,{chips_per_rank},1", "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_PORT": str(tpu_port), "TPU_PROCESS_ADDRESSES": f"localhost:{tpu_port}",
            "CLOUD_TPU_TASK_ID": "0"}


@pytest.mark.parametrize("chips", tpu_env.VALID_CHIPS)
@pytest.mark.parametrize("slot", [0, 3])
def test_isolated_process_has_tpu_inferences_own_isolation_variables(chips, slot):
    """Port, address, process bounds and task id as tpu-inference isolates a runtime; the chip bounds of a share
    are tested in tests/unit/test_tpu_layout.py, and agree with tpu-inference's `1,n,1` for 1, 2 and 4 chips."""
    env = isolated_env(chips, tpu_env.BASE_PORT + slot, "v5e")
    theirs = tpu_inference_dp_isolation(chips, slot)
    chip_bounds = theirs.pop("TPU_CHIPS_PER_PROCESS_BOUNDS")
    assert {k: env[k] for k in theirs} == theirs
    if chips in (1, 2, 4):
        assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == chip_bounds


def ray_sets(chip_ids: list[str], monkeypatch) -> dict[str, str]:
    """What Ray 2.60 puts in an actor's environment for a share of a host's chips (a host of 8 chips)."""
    for key in TPU_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(ray_tpu.TPUAcceleratorManager, "get_current_node_num_accelerators", staticmethod(lambda: 8))
    ray_tpu.TPUAcceleratorManager.set_current_process_visible_accelerator_ids(chip_ids)
    return {k: os.environ[k] for k in TPU_KEYS if k in os.environ}


@pytest.mark.parametrize("chips", [1, 2, 4])
def test_ray_alone_leaves_port_and_bounds_unset_and_ours_agree_with_what_it_sets(chips, monkeypatch):
    """Ray gives a sub-host share its chips (and bounds for 1 or 2 chips only): every runtime on the host would take
    libtpu's default port. Where Ray does set a bound, the isolated environment says the same."""
    ids = [str(4 + i) for i in range(chips)]
    ray_env = ray_sets(ids, monkeypatch)
    assert ray_env["TPU_VISIBLE_CHIPS"] == ",".join(ids)
    assert "TPU_PROCESS_PORT" not in ray_env and "TPU_PROCESS_ADDRESSES" not in ray_env
    assert ("TPU_CHIPS_PER_HOST_BOUNDS" in ray_env) == (chips in (1, 2))
    ours = isolated_env(chips, tpu_env.BASE_PORT)
    assert all(ours[k] == v for k, v in ray_env.items() if k != "TPU_VISIBLE_CHIPS"), (ray_env, ours)


def test_ray_drops_the_chip_list_for_a_whole_host(monkeypatch):
    """A whole host's share gets no variable at all from Ray: such a process on a multi-host slice would read the
    slice's metadata. Ours makes it a one-host cluster of its own."""
    assert ray_sets([str(i) for i in range(8)], monkeypatch) == {}
    assert isolated_env(8, tpu_env.BASE_PORT)["TPU_PROCESS_BOUNDS"] == "1,1,1"


def test_constants_are_rays():
    assert tpu_env.VALID_CHIPS == ray_tpu.TPU_VALID_CHIP_OPTIONS
    assert tpu_env.CHIPS_PER_HOST_MULTIHOST == ray_tpu.DEFAULT_TPU_NUM_CHIPS_PER_HOST
    from learner.hbm import CHIPS

    for generation in CHIPS:  # every chip preflight knows has a Ray name
        assert Topology(generation, (2, 2)).ray_version in ray_tpu.VALID_TPU_TYPES


RAY_WORKER_GRIDS = {**ray_tpu._VALID_TOPOLOGY_WORKER_DIMS_2D, **ray_tpu._VALID_TOPOLOGY_WORKER_DIMS_3D}


@pytest.mark.parametrize("shape", sorted(RAY_WORKER_GRIDS))
def test_host_grid_has_rays_numbers_in_the_names_order(shape):
    """Ray's worker tables and libtpu's host grid give the same numbers per position of the name; Ray calls those
    positions (y, x) / (z, y, x) and libtpu (x, y) / (x, y, z) (tests/unit/test_tpu_layout.py shows which wins)."""
    dims = tuple(int(d) for d in shape.split("x"))
    assert Topology("v5e" if len(dims) == 2 else "v4", dims).host_grid() == RAY_WORKER_GRIDS[shape]


def test_subslice_processes_share_addresses_and_differ_in_task_id():
    named = Topology.parse("v5e:2x4").named_hosts()
    envs = learner_envs("v5e:2x4", 2, 4, ["10.0.0.5", "10.0.0.6"], named)
    assert [e["CLOUD_TPU_TASK_ID"] for e in envs] == ["0", "1"]
    assert {e["TPU_PROCESS_ADDRESSES"] for e in envs} == {"10.0.0.5:8476,10.0.0.6:8477"}
    assert [e["TPU_PROCESS_PORT"] for e in envs] == ["8476", "8477"]
    assert {e["TPU_CHIPS_PER_PROCESS_BOUNDS"] for e in envs} == {"2,2,1"}
    with pytest.raises(ValueError, match="2 learner hosts were placed but 3"):
        subslice_env(layout(named), 0, ["a:1", "b:2", "c:3"])
    with pytest.raises(ValueError, match="has 8 chips but the placed hosts hold 16"):
        learner_envs("v5e:2x4", 4, 4, ["a", "b", "c", "d"], Topology.parse("v5e:4x4").named_hosts())


def test_every_tpu_process_of_a_run_has_its_own_port():
    for learner_hosts, replicas in [(1, 1), (1, 2), (2, 2), (2, 4)]:
        ips = [f"10.0.0.{i}" for i in range(learner_hosts)]
        topology = "v5e:2x2" if learner_hosts == 1 else f"v5e:2x{2 * learner_hosts}"
        chips = Topology.parse(topology).named_hosts() if learner_hosts > 1 else None
        envs = learner_envs(topology, learner_hosts, 4, ips, chips) + engine_envs(replicas, 4, learner_hosts)
        ports = [e["TPU_PROCESS_PORT"] for e in envs]
        assert len(set(ports)) == len(ports), ports
        metrics = [e["TPU_RUNTIME_METRICS_PORTS"] for e in envs]
        assert len(set(metrics + ports)) == 2 * len(ports), (metrics, ports)


def test_each_tpu_process_serves_libtpus_metrics_on_its_own_port():
    """Fails on main at 85b20f9: no process got TPU_RUNTIME_METRICS_PORTS there, so the learner and vllm-tpu of the
    split v5e-8 config both served libtpu's runtime metrics on its default 8431."""
    cfg = load_config(V5E8)
    [learner], [engine] = learner_process_env(cfg, None), engine_replica_env(cfg)
    assert learner["TPU_RUNTIME_METRICS_PORTS"] == str(tpu_env.METRICS_BASE_PORT)
    assert engine["TPU_RUNTIME_METRICS_PORTS"] == str(tpu_env.METRICS_BASE_PORT + 1)


def test_off_tpu_no_process_gets_tpu_variables():
    assert learner_envs("cpu", 2, 0) == [{}, {}] and engine_envs(3, 0, 1) == [{}, {}, {}]


def test_the_split_host_config_gives_learner_and_engine_separate_runtimes():
    """configs/countdown_qwen2.5-1.5b_tpu_v5e8.yaml: learner chips 0-3, vllm-tpu 4-7 of one host, each half at the
    bounds that ran on hardware first (1,4,1; tests/unit/test_tpu_layout.py)."""
    cfg = load_config(V5E8)
    [learner], [engine] = learner_process_env(cfg, None), engine_replica_env(cfg)
    assert learner["TPU_PROCESS_PORT"] != engine["TPU_PROCESS_PORT"]
    for env in (learner, engine):
        assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,4,1" and env["TPU_PROCESS_BOUNDS"] == "1,1,1"
        assert env["TPU_PROCESS_ADDRESSES"] == f"localhost:{env['TPU_PROCESS_PORT']}"


def test_learner_env_reaches_every_learner_process_last():
    cfg = load_config(V5E8, ["learner.env={LIBTPU_INIT_ARGS: --xla_tpu_foo=1, TPU_PROCESS_PORT: '9000'}"])
    assert learner_runtime_env(cfg)["env_vars"]["LIBTPU_INIT_ARGS"] == "--xla_tpu_foo=1"
    [env] = learner_process_env(cfg, None)
    assert env["TPU_PROCESS_PORT"] == "9000"  # the user's value wins over the computed one


def test_topology_names():
    assert Topology.parse("cpu") is None
    assert Topology.parse("v5e:2x4") == Topology("v5e", (2, 4))
    assert Topology.parse("v5e:2x4").ray_version == "v5litepod" and Topology.parse("v4:2x2x2").chips == 8
    for bad in ("v5e", "v5e:2", "v5e:axb", "v5e:0x4"):
        with pytest.raises(ValueError, match="not a TPU topology name"):
            Topology.parse(bad)
    with pytest.raises(ValueError, match="does not split into hosts"):
        Topology.parse("v5e:1x1").host_grid()
