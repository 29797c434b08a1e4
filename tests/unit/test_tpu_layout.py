"""A multi-host learner's process grid from its hosts' chip coordinates, and a split host's chip bounds, against
the pinned upstream code: Ray 2.60.0's own test coordinates and worker tables, and jax 0.12.0.1's multi-process
TPU tables (`_get_tpu_bounds`, jax/_src/test_multiprocess.py:189-288), both installed here; a half of an 8-chip
host tries what upstream runs on chips (1,4,1) before jax's table.

What is asserted is which processes are neighbours along which axis (what libtpu builds its ICI links from), read
back from each process's TPU_PROCESS_BOUNDS and CLOUD_TPU_TASK_ID in libtpu's numbering (x fastest), never that two
tuples are equal: on main at 85b20f9 aha's (x, y) grid and Ray's (y, x) table had equal tuples and opposite axes.
"""

from __future__ import annotations

import itertools
import math

import pytest
from jax._src.hardware_utils import TpuVersion
from jax._src.test_multiprocess import _get_tpu_bounds
from ray._private.accelerators import tpu as ray_tpu

from orchestration.cluster import tpu_env
from orchestration.cluster.tpu_env import isolated_env, learner_envs, share_bounds, share_settings
from orchestration.cluster.tpu_layout import (RAY_WORKER_DIMS_2D, RAY_WORKER_DIMS_3D, host_block, layout,
                                              neighbours, ray_worker_coords)

IPS = [f"10.0.0.{i}" for i in range(16)]
# Ray 2.60.0 python/ray/tests/accelerators/test_tpu.py, test_get_physical_worker_id_2d / _3d: chips [x, y(, z)]
# and the physical worker Ray computes for them.
RAY_TEST_2D = {0: [[0, 0], [0, 1], [1, 0], [1, 1]], 1: [[2, 0], [2, 1], [3, 0], [3, 1]],
               2: [[0, 2], [0, 3], [1, 2], [1, 3]], 3: [[2, 2], [2, 3], [3, 2], [3, 3]]}
RAY_TEST_3D = {0: [[0, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 1]], 1: [[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1]],
               8: [[0, 0, 2], [0, 1, 2], [0, 0, 3], [0, 1, 3]]}


def grid_of(env: dict[str, str]) -> tuple[int, int, int]:
    return tuple(int(v) for v in env["TPU_PROCESS_BOUNDS"].split(","))


def declared_neighbours(envs: list[dict[str, str]]) -> dict[tuple[int, int], str | None]:
    """Which processes (by index) the environments declare adjacent, and along which axis."""
    return {(i, j): neighbours(grid_of(envs[i]), (int(envs[i]["CLOUD_TPU_TASK_ID"]), int(envs[j]["CLOUD_TPU_TASK_ID"])))
            for i, j in itertools.combinations(range(len(envs)), 2)}


def touching(hosts: list) -> dict[tuple[int, int], str | None]:
    """Which hosts' chip blocks touch face to face, and along which axis: the truth the declarations must match."""
    blocks = [host_block(chips) for chips in hosts]
    out = {}
    for i, j in itertools.combinations(range(len(hosts)), 2):
        a, b = blocks[i], blocks[j]
        apart = [abs(a.origin[k] - b.origin[k]) for k in range(3)]
        axes = [k for k in range(3) if apart[k]]
        out[(i, j)] = "xyz"[axes[0]] if len(axes) == 1 and apart[axes[0]] == a.extent[axes[0]] else None
    return out


def test_worker_tables_are_rays():
    assert RAY_WORKER_DIMS_2D == ray_tpu._VALID_TOPOLOGY_WORKER_DIMS_2D
    assert RAY_WORKER_DIMS_3D == ray_tpu._VALID_TOPOLOGY_WORKER_DIMS_3D


@pytest.mark.parametrize("parent", sorted({**RAY_WORKER_DIMS_2D, **RAY_WORKER_DIMS_3D}))
def test_ray_worker_coords_are_what_ray_reads_back(parent):
    """Fails on main at 85b20f9 (no tpu_layout there). `ray_worker_coords` inverts Ray's own coordinate reading."""
    dims = {**RAY_WORKER_DIMS_2D, **RAY_WORKER_DIMS_3D}[parent]
    for worker in range(min(64, math.prod(dims))):
        coords = [list(c[:2]) if len(dims) == 2 else list(c) for c in ray_worker_coords(worker, parent)]
        assert ray_tpu._get_physical_worker_id_from_coords(coords, parent) == worker, (parent, worker)


def test_rays_test_coordinates_are_ray_worker_coords():
    """Fails on main at 85b20f9 (no tpu_layout there). Ray's test coordinates are the chips `ray_worker_coords`
    gives, so the fallback on Ray's table places hosts where Ray's tests say they are."""
    for worker, chips in RAY_TEST_2D.items():
        assert sorted(ray_worker_coords(worker, "4x4")) == sorted((x, y, 0) for x, y in chips)
    for worker, chips in RAY_TEST_3D.items():
        assert sorted(ray_worker_coords(worker, "4x4x4")) == sorted(tuple(c) for c in chips)


def test_rays_2x4_subslice_is_two_hosts_along_x():
    """Fails on main at 85b20f9: there learner_envs takes no coordinates and declares this learner's two processes
    neighbours along y (TPU_PROCESS_BOUNDS=1,2,1). Ray's sub-slice "2x4" #0 of a 4x4 slice is its workers 0 and 1
    (Ray's own labels), whose chips in Ray's own test sit side by side along x: the processes must be x neighbours."""
    members = [w for w in range(4) if ray_tpu._build_subslice_labels(w, "4x4")["ray.io/tpu-subslice-2x4"] == "0"]
    assert members == [0, 1]
    hosts = [RAY_TEST_2D[w] for w in members]
    envs = learner_envs("v5e:2x4", 2, 4, IPS[:2], hosts)
    assert declared_neighbours(envs) == touching(hosts) == {(0, 1): "x"}
    assert {e["TPU_CHIPS_PER_PROCESS_BOUNDS"] for e in envs} == {"2,2,1"}


def test_ray_and_libtpu_read_a_name_with_opposite_axes():
    """Fails on main at 85b20f9 (no tpu_layout there). For a name that is not square, Ray's hosts span the name's
    first number along y and libtpu's along x: the name alone cannot say where the hosts are."""
    ray_chips = [c for w in range(8) for c in ray_worker_coords(w, "4x8")]
    libtpu_chips = [c for host in tpu_env.Topology.parse("v5e:4x8").named_hosts() for c in host]
    span = lambda chips, axis: max(c[axis] for c in chips) + 1
    assert (span(ray_chips, 0), span(ray_chips, 1)) == (8, 4)
    assert (span(libtpu_chips, 0), span(libtpu_chips, 1)) == (4, 8)


@pytest.mark.parametrize("parent", ["4x4", "4x8", "8x8", "2x2x2", "2x2x4", "4x4x4"])
def test_a_whole_slice_in_any_bundle_order_declares_its_real_neighbours(parent):
    """Fails on main at 85b20f9 (task ids there were bundle order). Hosts of a slice placed in reverse order still
    get task ids by place and addresses in task order, and every pair is declared adjacent exactly where its chips
    touch."""
    dims = {**RAY_WORKER_DIMS_2D, **RAY_WORKER_DIMS_3D}[parent]
    hosts = [ray_worker_coords(w, parent) for w in range(math.prod(dims))][::-1]
    n = len(hosts)
    envs = learner_envs("cpu", n, 4, IPS[:n], hosts)
    assert declared_neighbours(envs) == touching(hosts)
    order = layout(hosts).in_task_order()
    assert envs[0]["TPU_PROCESS_ADDRESSES"] == ",".join(f"{IPS[i]}:{tpu_env.BASE_PORT + i}" for i in order)
    assert sorted(int(e["CLOUD_TPU_TASK_ID"]) for e in envs) == list(range(n))


JAX_CASES = [(v, n, c) for v in (TpuVersion.v4, TpuVersion.v5p, TpuVersion.v5e, TpuVersion.v6e)
             for n, c in ((8, 4), (8, 1), (4, 2), (4, 1), (2, 1))]


def jax_hosts(version, chips: int, per_process: int) -> list:
    """The chips of each process of jax's table for `chips` chips at `per_process` each, placed x fastest."""
    grid, block = (tuple(int(v) for v in b.split(",")) for b in _get_tpu_bounds(version, chips, per_process))
    places = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    return [[(px * block[0] + i, py * block[1] + j, pz * block[2] + k) for i in range(block[0])
             for j in range(block[1]) for k in range(block[2])] for px, py, pz in places]


@pytest.mark.parametrize("version,chips,per_process", JAX_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_jax_multiprocess_tables_neighbours_hold(version, chips, per_process):
    """Fails on main at 85b20f9 (learner processes there got a grid from a name and a fixed 2x2 block, whatever the
    chips). jax's own multi-process layouts, given as coordinates in shuffled order, come back with each pair of
    processes declared adjacent exactly where jax's layout puts them side by side, and jax's per-process block."""
    hosts = jax_hosts(version, chips, per_process)[::-1]
    n = len(hosts)
    envs = learner_envs("cpu", n, per_process, IPS[:n], hosts)
    assert declared_neighbours(envs) == touching(hosts)
    assert {e["TPU_CHIPS_PER_PROCESS_BOUNDS"] for e in envs} == {_get_tpu_bounds(version, chips, per_process)[1]}


GENERATIONS = {"v4": TpuVersion.v4, "v5p": TpuVersion.v5p, "v5e": TpuVersion.v5e, "v6e": TpuVersion.v6e}


TPU_INFERENCE_HALF = "1,4,1"
"""tpu-inference's bounds for a process on 4 chips of an 8-chip host (tpu_worker.py:298-305 `1,n,1`; its two-process
example runs each half of an 8-chip host at 1,4,1); Google's tunix runs
GRPO's trainer on chips 0-3 of a v5e-8 at 1,4,1 (tunix/experimental/examples/math_gsm8k_dist/README.md,
scripts/get_sorted_tpu_ids.py: "applies to single-host slices such as v5e-8 and v6e-8")."""


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_a_split_hosts_chip_bounds_put_what_ran_on_hardware_first(generation):
    """Fails on main at 98997ee: half of a v5e-8 or v6e-8 got 2,2,1 there (jax's tables, which jax itself skips on
    Cloud v5e), never seen running on such a half. A half now tries 1,4,1 (what upstream runs) first and jax's
    2,2,1 second; shares of 1 and 2 chips are jax's and Ray's single bound, on every generation."""
    host = tpu_env.HOST_CHIPS[generation]
    version = GENERATIONS[generation]
    for chips in (c for c in tpu_env.VALID_CHIPS if c < host):
        try:
            jax_bounds = _get_tpu_bounds(version, host, chips)[1]
        except ValueError:  # jax has no table for this share of this host: a 2x2x1 host's
            jax_bounds = _get_tpu_bounds(version, 4, chips)[1]
        expected = [TPU_INFERENCE_HALF, jax_bounds] if chips == 4 else [jax_bounds]
        assert share_settings(generation, chips) == expected, (generation, chips)
        assert isolated_env(chips, tpu_env.BASE_PORT, generation)["TPU_CHIPS_PER_PROCESS_BOUNDS"] == expected[0]
        assert isolated_env(chips, tpu_env.BASE_PORT, generation, chip_bounds=expected[-1]
                            )["TPU_CHIPS_PER_PROCESS_BOUNDS"] == expected[-1]
    assert share_bounds(generation, 1) == ray_tpu.TPU_CHIPS_PER_HOST_BOUNDS_1_CHIP_CONFIG
    assert share_bounds(generation, 2) == ray_tpu.TPU_CHIPS_PER_HOST_BOUNDS_2_CHIP_CONFIG
    bare = isolated_env(2, tpu_env.BASE_PORT, generation, chip_bounds=tpu_env.NO_CHIP_BOUNDS)
    assert "TPU_CHIPS_PER_PROCESS_BOUNDS" not in bare and "TPU_CHIPS_PER_HOST_BOUNDS" not in bare


@pytest.mark.parametrize("generation,chips", [("v5e", 8), ("v6e", 8)])
def test_a_process_holding_a_whole_single_host_vm_gets_no_chip_bounds(generation, chips):
    """Fails on main at 85b20f9: the Gemma learner (tpu: 8) got TPU_CHIPS_PER_PROCESS_BOUNDS=1,8,1 there, a shape
    jax's table has for no host (a whole v5e-8 is 4,2,1, a v6e-8 2,4,1). A whole single-host VM keeps libtpu's own
    bounds (and its metadata, which describes just that host); it is still a one-process cluster of its own. A whole
    4-chip host of a slice gets the GKE plugin's one-host variables instead (tests/unit/test_tpu_gke.py)."""
    env = isolated_env(chips, tpu_env.BASE_PORT, generation)
    assert "TPU_CHIPS_PER_PROCESS_BOUNDS" not in env and "TPU_CHIPS_PER_HOST_BOUNDS" not in env
    assert "TPU_SKIP_MDS_QUERY" not in env
    assert env["TPU_PROCESS_BOUNDS"] == "1,1,1" and env["CLOUD_TPU_TASK_ID"] == "0"


def test_hosts_that_are_not_one_slice_are_refused():
    with pytest.raises(ValueError, match="do not tile one box"):
        layout([RAY_TEST_2D[0], RAY_TEST_2D[3]])  # diagonal hosts: no ICI link between them
    with pytest.raises(ValueError, match="blocks of different shapes"):
        layout([RAY_TEST_2D[0], [[2, 0]]])
    with pytest.raises(ValueError, match="do not fill one block"):
        host_block([[0, 0], [1, 1]])
    with pytest.raises(ValueError, match="no worker grid"):
        ray_worker_coords(0, "2x8")
