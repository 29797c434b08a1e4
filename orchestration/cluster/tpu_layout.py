"""Where each host of a TPU slice sits, read from its chips' coordinates, and the process grid that follows.

A learner on several hosts is one libtpu cluster: every process must declare the grid of processes
(`TPU_PROCESS_BOUNDS`, hosts along x, y, z), its own block of chips (`TPU_CHIPS_PER_PROCESS_BOUNDS`), its place in
that grid (`CLOUD_TPU_TASK_ID`) and every member's address in task order (`TPU_PROCESS_ADDRESSES`). These follow
from where the hosts' chips are, and the names people give a slice's shape do not say it reliably:

- libtpu 0.0.50.1 reads a topology name "AxB[xC]" as x=A, y=B[, z=C] and numbers its processes x fastest, then y,
  then z (the devices of `topologies.get_topology_desc("v5e:4x4")`: process 1 holds x 2-3, y 0-1;
  tests/integration/test_tpu_env_topology.py reads this layout back). A TPU VM's own metadata agrees (a v4-256:
  TOPOLOGY 4x4x8, HOST_BOUNDS 2,2,8, CHIPS_PER_HOST_BOUNDS 2,2,1).
- Ray 2.60.0 reads the same string the other way round: its worker tables are (worker_y, worker_x) and
  (worker_z, worker_y, worker_x) (ray/_private/accelerators/tpu.py:135, 145-168), and it unpacks the name as
  `topo_y, topo_x = chip_dims` (tpu.py:378) while reading chip coordinates as [x, y] (tpu.py:381). So Ray's
  sub-slice "2x4" of a 4x4 slice is two hosts side by side along x (its workers 0 and 1, tpu.py:461; Ray's own
  `test_get_physical_worker_id_2d` puts worker 1 at x 2-3), the shape libtpu calls 4x2 (and the docstring of
  Ray's `SubslicePlacementGroup`, ray/util/tpu.py:1765-1766, draws it as a column: its code and its picture
  disagree). For a square parent the two readings place the same hosts; for any other they differ.

So the grid is computed here from coordinates, never from a name: each host's chips (what libtpu's SDK reports on
that host, `libtpu.sdk.slice.get_chip_coordinates()`, the call Ray's own sub-slice discovery makes,
ray/util/tpu.py:1325-1353) give its block; the blocks give the grid and each host's place in it; the task id is
that place numbered x fastest, as libtpu numbers processes. Where the SDK is not there to ask (no TPU: the test
clusters), `ray_worker_coords` turns Ray's own table back into the coordinates Ray assumed, with its (y, x) order
honoured. Nothing here imports Ray or JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Coords = tuple[int, int, int]
AXES = ("x", "y", "z")
RAY_WORKER_DIMS_2D = {"2x2": (1, 1), "2x4": (1, 2), "4x4": (2, 2), "4x8": (2, 4), "8x8": (4, 4), "8x16": (4, 8),
                      "16x16": (8, 8)}
"""Ray 2.60.0's `_VALID_TOPOLOGY_WORKER_DIMS_2D` (tpu.py:145-153), topology -> (worker_y, worker_x); a unit test
checks it equals Ray's."""
RAY_WORKER_DIMS_3D = {"2x2x1": (1, 1, 1), "2x2x2": (1, 1, 2), "2x2x4": (1, 1, 4), "2x4x4": (1, 2, 4),
                      "4x4x4": (2, 2, 4), "4x4x8": (2, 2, 8), "4x8x8": (2, 4, 8), "8x8x8": (4, 4, 8),
                      "8x8x16": (4, 4, 16), "8x16x16": (4, 8, 16), "16x16x16": (8, 8, 16), "16x16x24": (8, 8, 24)}
"""Ray 2.60.0's `_VALID_TOPOLOGY_WORKER_DIMS_3D` (tpu.py:155-168), topology -> (worker_z, worker_y, worker_x)."""


def as_3d(coords) -> Coords:
    """A chip's [x, y] or [x, y, z] as (x, y, z)."""
    c = tuple(int(v) for v in coords)
    if len(c) not in (2, 3):
        raise ValueError(f"chip coordinates {list(coords)} are not [x, y] or [x, y, z]")
    return (*c, 0)[:3] if len(c) == 2 else c


@dataclass(frozen=True)
class Block:
    """One host's chips: the corner nearest the origin and the extent along x, y, z."""

    origin: Coords
    extent: Coords


def host_block(chips) -> Block:
    """The block a host's chip coordinates fill; raises when they are not one whole block."""
    points = {as_3d(c) for c in chips}
    if not points:
        raise ValueError("a host reported no chip coordinates")
    origin = tuple(min(p[a] for p in points) for a in range(3))
    extent = tuple(max(p[a] for p in points) - origin[a] + 1 for a in range(3))
    if math.prod(extent) != len(points):
        raise ValueError(f"a host's chips {sorted(points)} do not fill one block of the slice")
    return Block(origin, extent)


@dataclass(frozen=True)
class SliceLayout:
    """Hosts placed in a grid: `grid` hosts along x, y, z; `block` chips per host; `places[i]` is host i's place."""

    grid: Coords
    block: Coords
    places: tuple[Coords, ...]

    @property
    def task_ids(self) -> list[int]:
        """Each host's task id: its place numbered x fastest, then y, then z (libtpu's process order)."""
        gx, gy, _ = self.grid
        return [x + gx * (y + gy * z) for x, y, z in self.places]

    def in_task_order(self) -> list[int]:
        """Host indices sorted by task id."""
        ids = self.task_ids
        return sorted(range(len(ids)), key=ids.__getitem__)


def layout(hosts: list) -> SliceLayout:
    """The grid `hosts` form; `hosts[i]` is host i's chip coordinates. Raises unless they tile one box."""
    blocks = [host_block(chips) for chips in hosts]
    extents = {b.extent for b in blocks}
    if len(extents) != 1:
        raise ValueError(f"the hosts hold blocks of different shapes {sorted(extents)}; one libtpu cluster needs "
                         "hosts of one shape")
    [block] = extents
    low = tuple(min(b.origin[a] for b in blocks) for a in range(3))
    places = []
    for b in blocks:
        offset = tuple(b.origin[a] - low[a] for a in range(3))
        if any(offset[a] % block[a] for a in range(3)):
            raise ValueError(f"a host's block at {b.origin} is not aligned with the others' {block} blocks")
        places.append(tuple(offset[a] // block[a] for a in range(3)))
    grid = tuple(max(p[a] for p in places) + 1 for a in range(3))
    if len(set(places)) != len(places) or math.prod(grid) != len(places):
        raise ValueError(f"the hosts' chips do not tile one box (places {places} in a {grid} grid): they are not "
                         "one (sub-)slice of ICI neighbours")
    return SliceLayout(grid, block, tuple(places))


def neighbours(grid: Coords, tasks: tuple[int, int]) -> str | None:
    """The axis along which two task ids of a `grid` of processes are adjacent (libtpu's x-fastest numbering);
    None when they are not neighbours."""
    gx, gy, _ = grid
    place = lambda t: (t % gx, (t // gx) % gy, t // (gx * gy))
    a, b = place(tasks[0]), place(tasks[1])
    diff = [abs(a[i] - b[i]) for i in range(3)]
    return AXES[diff.index(1)] if sorted(diff) == [0, 0, 1] else None


def ray_worker_coords(worker: int, parent: str) -> list[Coords]:
    """The chips Ray 2.60.0 takes physical worker `worker` of slice topology `parent` to hold.

    The inverse of Ray's `_get_physical_worker_id_from_coords` (tpu.py:358-429) with its axis order kept: the name
    unpacks as (y, x) / (z, y, x), the worker tables are (y, x) / (z, y, x), the coordinates [x, y, z].
    """
    dims = tuple(int(d) for d in parent.lower().split("x"))
    if parent not in RAY_WORKER_DIMS_2D and parent not in RAY_WORKER_DIMS_3D:
        raise ValueError(f"Ray 2.60.0 has no worker grid for a {parent} slice (its tables: tpu.py:145-168)")
    if len(dims) == 2:
        (topo_y, topo_x), (wy_n, wx_n), wz_n, topo_z = dims, RAY_WORKER_DIMS_2D[parent], 1, 1
    else:
        (topo_z, topo_y, topo_x), (wz_n, wy_n, wx_n) = dims, RAY_WORKER_DIMS_3D[parent]
    wz, rest = divmod(worker, wy_n * wx_n)
    wy, wx = divmod(rest, wx_n)
    if wz >= wz_n:
        raise ValueError(f"worker {worker} is outside Ray's {parent} worker grid")
    bx, by, bz = max(1, topo_x // wx_n), max(1, topo_y // wy_n), max(1, topo_z // wz_n)
    return [(wx * bx + i, wy * by + j, wz * bz + k) for k in range(bz) for j in range(by) for i in range(bx)]


def one_host_shape(parent: str) -> str:
    """Ray's one-worker sub-slice shape of a 2-D or 3-D parent ("2x2" / "2x2x1"): its label index is the worker's
    physical position (Ray's `_build_subslice_labels`, tpu.py:432-461)."""
    return "2x2" if parent.count("x") == 1 else "2x2x1"
