"""The libtpu environment of every TPU process of a run, computed by the driver before it starts them.

Ray hands an actor its chips and little else: `TPU_VISIBLE_CHIPS` for part of a host, plus bounds for 1- or
2-chip shares only (ray/_private/accelerators/tpu.py:826-874, Ray 2.60). Two runtimes on one host (the learner on
chips 0-3 and vllm-tpu on 4-7 of a v5e-8) would then both start libtpu on its default port and bounds, and a
process holding a whole host of a multi-host slice would read the slice's metadata and wait for hosts that are not
its own. Every TPU process therefore starts with one of two environments:

- `isolated_env`: the process is a libtpu cluster of its own, one host, its chips: every engine replica, and a
  learner that runs as one process. This is tpu-inference 0.32.0's rule for runtimes that share a host
  (tpu_inference/worker/tpu_worker.py:298-305, `_setup_dp_chip_isolation`) and for a host of a multi-host slice
  run as its own cluster (tpu_worker.py:72-89 `PPConfig`, 336-343): bounds `1,n,1` / `1,1,1`, its own port, itself
  as the only address, task 0. The chips themselves stay Ray's `TPU_VISIBLE_CHIPS`.
- `subslice_env`: process i of a learner that spans the hosts of a sub-slice (`learner.hosts > 1`): the
  sub-slice's grid of processes and each host's block of chips, every member's address, its task id i (the
  variables jax/_src/test_multiprocess.py:404-409 sets for a multi-process TPU cluster, jax 0.12.0.1). The grid is
  the one libtpu itself lays out for the topology name (its topology description, checked in the tests), which is
  also the worker grid Ray's sub-slice placement uses (`_VALID_TOPOLOGY_WORKER_DIMS_2D/3D`, tpu.py:132-160).

Ports: each TPU process of a run gets its own, `BASE_PORT + slot` (learner processes take the first slots, engine
replicas the next), so two processes that share a host never share one. Nothing here imports Ray or JAX: the config
validators use the same facts (`Topology`, `VALID_CHIPS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BASE_PORT = 8476
"""libtpu's default process port, tpu-inference's `BASE_TPU_PROCESS_PORT` (distributed/jax_parallel_state.py:28)."""
VALID_CHIPS = (1, 2, 4, 8)
"""Chip counts Ray's `TPU` resource accepts per actor (`TPU_VALID_CHIP_OPTIONS`, ray tpu.py:23)."""
CHIPS_PER_HOST_MULTIHOST = 4
"""Chips of one host of a multi-host slice (`DEFAULT_TPU_NUM_CHIPS_PER_HOST`, ray tpu.py:60)."""
HOST_BLOCK = {2: (2, 2), 3: (2, 2, 1)}
"""A host's chips as a block of the slice's grid (x, y[, z]), for 2-D (v5e, v6e) and 3-D (v4, v5p) topologies."""
RAY_VERSION = {"v5e": "v5litepod"}
"""Ray's name of a TPU generation where it differs from JAX's (ray tpu.py:86 `VALID_TPU_TYPES`)."""


@dataclass(frozen=True)
class Topology:
    """A TPU topology name as `learner.topology` writes it (JAX's `topologies.get_topology_desc` name)."""

    generation: str
    """"v5e", "v6e", "v4", ..."""
    dims: tuple[int, ...]
    """Chips along x, y[, z], in the name's order (libtpu's order: "v5e:2x4" is x 2, y 4)."""

    @classmethod
    def parse(cls, name: str) -> Topology | None:
        """None for "cpu"; raises ValueError for a name that is not GENERATION:AxB[xC]."""
        if name == "cpu":
            return None
        generation, _, shape = name.partition(":")
        try:
            dims = tuple(int(d) for d in shape.lower().split("x"))
        except ValueError:
            dims = ()
        if not generation or len(dims) not in (2, 3) or min(dims) < 1:
            raise ValueError(f"learner.topology {name!r} is not a TPU topology name such as v5e:2x4 or v4:2x2x2 "
                             "(or cpu)")
        return cls(generation.lower(), dims)

    @property
    def chips(self) -> int:
        return math.prod(self.dims)

    @property
    def shape(self) -> str:
        """"2x4": the sub-slice topology Ray's placement takes."""
        return "x".join(map(str, self.dims))

    @property
    def ray_version(self) -> str:
        """The generation as Ray's TPU code names it ("v5litepod" for v5e)."""
        return RAY_VERSION.get(self.generation, self.generation)

    def host_grid(self) -> tuple[int, ...]:
        """Hosts along each axis when every host holds CHIPS_PER_HOST_MULTIHOST chips as one block."""
        block = HOST_BLOCK[len(self.dims)]
        if any(d % b for d, b in zip(self.dims, block)):
            raise ValueError(f"learner.topology {self.generation}:{self.shape} does not split into hosts of "
                             f"{'x'.join(map(str, block))} chips")
        return tuple(d // b for d, b in zip(self.dims, block))


def bounds(values: tuple[int, ...]) -> str:
    """libtpu's "x,y,z" form, padded with 1s."""
    return ",".join(str(v) for v in (*values, 1, 1, 1)[:3])


def isolated_env(chips: int, port: int) -> dict[str, str]:
    """A process that is its own one-host libtpu cluster over `chips` of its host's chips."""
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": f"1,{chips},1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": str(port),
        "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "CLOUD_TPU_TASK_ID": "0",
        # The older names, which Ray writes for 1- and 2-chip shares (tpu.py:49-56): kept equal to the above so no
        # stale value of theirs can disagree with ours.
        "TPU_CHIPS_PER_HOST_BOUNDS": f"1,{chips},1",
        "TPU_HOST_BOUNDS": "1,1,1",
    }


def subslice_env(topology: Topology, process: int, addresses: list[str]) -> dict[str, str]:
    """Process `process` of a learner spanning the hosts of `topology`; `addresses[i]` is process i's "ip:port"."""
    grid = topology.host_grid()
    if len(addresses) != math.prod(grid):
        raise ValueError(f"learner.topology {topology.generation}:{topology.shape} spans {math.prod(grid)} hosts "
                         f"but {len(addresses)} learner processes were placed")
    block = HOST_BLOCK[len(topology.dims)]
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": bounds(block),
        "TPU_PROCESS_BOUNDS": bounds(grid),
        "TPU_PROCESS_PORT": addresses[process].rsplit(":", 1)[1],
        "TPU_PROCESS_ADDRESSES": ",".join(addresses),
        "CLOUD_TPU_TASK_ID": str(process),
        "TPU_CHIPS_PER_HOST_BOUNDS": bounds(block),
        "TPU_HOST_BOUNDS": bounds(grid),
    }


def learner_envs(topology: str, hosts: int, chips: float, host_ips: list[str] | None = None) -> list[dict[str, str]]:
    """The TPU environment of each learner process ({} each when the learner has no TPU chips).

    `host_ips`: the node address of each process's placement bundle, needed when hosts > 1.
    """
    if not chips:
        return [{} for _ in range(hosts)]
    if hosts == 1:
        return [isolated_env(int(chips), BASE_PORT)]
    parsed = Topology.parse(topology)
    if parsed is None or host_ips is None or len(host_ips) != hosts:
        raise ValueError(f"learner.hosts={hosts} on TPU needs a TPU learner.topology and one placed host per "
                         f"process (got topology {topology!r}, hosts {host_ips})")
    addresses = [f"{ip}:{BASE_PORT + i}" for i, ip in enumerate(host_ips)]
    return [subslice_env(parsed, i, addresses) for i in range(hosts)]


def engine_envs(replicas: int, chips: float, learner_hosts: int) -> list[dict[str, str]]:
    """The TPU environment of each engine replica's server actor (its engine process inherits it); {} off TPU."""
    if not chips:
        return [{} for _ in range(replicas)]
    return [isolated_env(int(chips), BASE_PORT + learner_hosts + i) for i in range(replicas)]
