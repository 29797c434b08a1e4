"""The libtpu environment of every TPU process of a run, computed by the driver before it starts them.

Ray hands an actor its chips and little else: `TPU_VISIBLE_CHIPS` for part of a host, plus bounds for 1- or
2-chip shares only (ray/_private/accelerators/tpu.py:796-874, Ray 2.60). Two runtimes on one host (the learner on
chips 0-3 and vllm-tpu on 4-7 of a v5e-8) would then both start libtpu on its default port, and a process holding a
whole host of a multi-host slice would read the slice's metadata and wait for hosts that are not its own. Every TPU
process therefore starts with one of two environments:

- `isolated_env`: the process is a libtpu cluster of its own, one host: every engine replica, and a learner that
  runs as one process (tpu-inference 0.32.0's rule for runtimes that share a host, tpu_worker.py:298-305
  `_setup_dp_chip_isolation`, and for a host of a multi-host slice run as its own cluster, tpu_worker.py:72-89):
  process bounds 1,1,1, its own port, itself as the only address, task 0. Its chip bounds are those of its share
  of the host (`SHARE_RULES`: the settings tried in order, each with its source; the run keeps the first whose
  psum works, orchestration/cluster/tpu_settle.py), and none at all when it holds a whole single-host VM: libtpu's
  own description of the host is then the right one (jax 0.12.0.1 describes a whole v5e-8 as 4,2,1 and a whole
  v6e-8 as 2,4,1, jax/_src/test_multiprocess.py:259, 286; a bound of 1,8,1 matches neither). A whole 4-chip host
  of a multi-host slice (a v5e-16 engine) gets the GKE TPU device plugin's one-host variables instead
  (orchestration/cluster/tpu_gke.py), so its libtpu does not read the 4-host slice from the VM's metadata.
  The chips themselves stay Ray's `TPU_VISIBLE_CHIPS`.
- `subslice_env`: a process of a learner that spans the hosts of a sub-slice (`learner.hosts > 1`): the grid of
  processes, each host's block of chips, every member's address in task order and its own task id, all from the
  hosts' chip coordinates (orchestration/cluster/tpu_layout.py), the variables jax sets for a multi-process TPU
  cluster (jax/_src/test_multiprocess.py:404-409), and the GKE plugin's for the sub-slice those coordinates span
  (`TPU_SKIP_MDS_QUERY`, `TPU_TOPOLOGY`, `TPU_ACCELERATOR_TYPE`, `TPU_WORKER_HOSTNAMES`, `TPU_WORKER_ID`, host
  bounds; tpu_gke.py): without them libtpu reads the whole slice from the VM's metadata.

Ports: each TPU process of a run gets its own, `BASE_PORT + slot` (learner processes take the first slots, engine
replicas the next), so two processes that share a host never share one; likewise its own libtpu runtime-metrics
port, `METRICS_BASE_PORT + slot` (`TPU_RUNTIME_METRICS_PORTS`): every libtpu otherwise serves its metrics on 8431, and
the second process on a host either fails to bind it or shares it (SO_REUSEPORT), so a monitor such as tpu-info
reads one of them at random. Nothing here imports Ray or JAX: the config validators use the same facts
(`Topology`, `VALID_CHIPS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestration.cluster.tpu_gke import slice_env
from orchestration.cluster.tpu_layout import SliceLayout, layout

BASE_PORT = 8476
"""libtpu's default process port, tpu-inference's `BASE_TPU_PROCESS_PORT` (distributed/jax_parallel_state.py:28)."""
METRICS_BASE_PORT = 8431
"""libtpu's runtime-metrics port (`--runtime_metric_service_port`'s default, libtpu 0.0.50.1; a TPU VM's metadata lists
8431-8434 as TPU_RUNTIME_METRICS_PORTS). A process reads its own from `TPU_RUNTIME_METRICS_PORTS` (one port for one
process: tpu_info/README.md of Google's cloud-accelerator-diagnostics, the `tpu-info` tool that reads them)."""
VALID_CHIPS = (1, 2, 4, 8)
"""Chip counts Ray's `TPU` resource accepts per actor (`TPU_VALID_CHIP_OPTIONS`, ray tpu.py:23)."""
CHIPS_PER_HOST_MULTIHOST = 4
"""Chips of one host of a multi-host slice (`DEFAULT_TPU_NUM_CHIPS_PER_HOST`, ray tpu.py:60)."""
HOST_BLOCK = {2: (2, 2), 3: (2, 2, 1)}
"""A host's chips as a block of the slice's grid (x, y[, z]), for 2-D (v5e, v6e) and 3-D (v4, v5p) topologies."""
RAY_VERSION = {"v5e": "v5litepod"}
"""Ray's name of a TPU generation where it differs from JAX's (ray tpu.py:81 `VALID_TPU_TYPES`)."""
HOST_CHIPS = {"v4": 4, "v5p": 4, "v5e": 8, "v6e": 8}
"""The most chips one host of a generation holds: 8 on a single-host v5e / v6e VM (`TPU_8_CHIPS_PER_HOST_TYPES`,
ray tpu.py:71), 4 on every other host (`DEFAULT_TPU_NUM_CHIPS_PER_HOST`, tpu.py:60). A generation not listed is
taken to have 8-chip hosts."""


@dataclass(frozen=True)
class ShareRule:
    """The chip bounds of a process holding part of a host, in the order they are tried, and where upstream states
    each."""

    settings: tuple[str, ...]
    source: str


SHARE_RULES = {
    1: ShareRule(("1,1,1",), "ray 2.60.0 ray/_private/accelerators/tpu.py:52 TPU_CHIPS_PER_HOST_BOUNDS_1_CHIP_CONFIG; "
                             "jax 0.12.0.1 jax/_src/test_multiprocess.py:241, 282 (1 chip per process, every generation)"),
    2: ShareRule(("1,2,1",), "ray 2.60.0 tpu.py:53 TPU_CHIPS_PER_HOST_BOUNDS_2_CHIP_CONFIG; jax 0.12.0.1 "
                             "test_multiprocess.py:243; the GKE TPU device plugin's getChipsPerDim(2)"),
    4: ShareRule(("1,4,1", "2,2,1"),
                 "first 1,4,1, what runs on the chips: tpu-inference's two-process v6e-8 example and its production "
                 "isolation (tpu_inference/worker/tpu_worker.py:298-305 `1,n,1`), vLLM's "
                 "examples/offline_inference/data_parallel_tpu.py (two 4-chip ranks of 8 chips), and for v5e "
                 "Google's tunix: "
                 "scripts/get_sorted_tpu_ids.py (\"TPU_CHIPS_PER_PROCESS_BOUNDS=1,4,1 ... applies to single-host "
                 "slices such as v5e-8 and v6e-8\") and tunix/experimental/examples/math_gsm8k_dist/README.md (a "
                 "converging GRPO run on a v5e-8 with its trainer on chips 0-3 at TRAINER_CHIP_BOUNDS=1,4,1); then "
                 "2,2,1, jax 0.12.0.1's tables (test_multiprocess.py:257, 284; jax skips them on Cloud v5e) and the "
                 "GKE plugin's getChipsPerDim(4), neither seen working on half of an 8-chip host"),
}
"""Chip bounds of a share of one host, by its chip count. The same for every generation that has such a share: a
v4 or v5p host has 4 chips (2x2x1), so its shares are 1 or 2 chips; a v5e or v6e host has 8 and also 4-chip halves.
The run and `aha tpu-check` try a half's settings in this order (then Ray's chips alone) and say which worked."""
NO_CHIP_BOUNDS = ""
"""A `chip_bounds` value: only Ray's TPU_VISIBLE_CHIPS, libtpu derives the rest (the last thing tried)."""
AXES = {"v4": 3, "v5p": 3}
"""Axes of a generation's topology names (v4 and v5p are 3-D tori; v5e and v6e 2-D)."""


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

    def named_hosts(self) -> list[list[tuple[int, ...]]]:
        """Each host's chip coordinates as libtpu lays the name out (hosts numbered x fastest): what preflight
        shows. On a slice the placed hosts' own coordinates decide (tpu_layout.py)."""
        grid, block = self.host_grid(), HOST_BLOCK[len(self.dims)]
        g, b = (*grid, 1)[:3], (*block, 1)[:3]
        return [[(hx * b[0] + i, hy * b[1] + j, hz * b[2] + k) for k in range(b[2]) for j in range(b[1])
                 for i in range(b[0])] for hz in range(g[2]) for hy in range(g[1]) for hx in range(g[0])]


def generation_of(topology: str) -> str | None:
    """The TPU generation of a `learner.topology` name; None for cpu."""
    parsed = Topology.parse(topology)
    return parsed.generation if parsed else None


def bounds(values: tuple[int, ...]) -> str:
    """libtpu's "x,y,z" form, padded with 1s."""
    return ",".join(str(v) for v in (*values, 1, 1, 1)[:3])


def host_size(generation: str | None, multi_host: bool = False) -> int:
    """Chips of one host: 4 on a host of a multi-host slice, else the generation's largest host."""
    return CHIPS_PER_HOST_MULTIHOST if multi_host else HOST_CHIPS.get(generation or "", 8)


def share_settings(generation: str | None, chips: int, host_chips: int | None = None) -> list[str]:
    """The chip bounds to try, in order, for a process holding `chips` of a host of `host_chips` (default: the
    generation's largest host); [] for the whole host."""
    if chips >= (host_chips or host_size(generation)):
        return []
    return list(SHARE_RULES[chips].settings)


def share_bounds(generation: str | None, chips: int, host_chips: int | None = None) -> str | None:
    """The first chip bounds for a process holding `chips` of one host; None for the whole host."""
    return next(iter(share_settings(generation, chips, host_chips)), None)


def metrics_port(port: int) -> int:
    """The runtime-metrics port of the process whose libtpu port is `port` (the same slot)."""
    return METRICS_BASE_PORT + port - BASE_PORT


def isolated_env(chips: int, port: int, generation: str | None = None, host_chips: int | None = None,
                 chip_bounds: str | None = None) -> dict[str, str]:
    """A process that is its own one-host libtpu cluster over `chips` of its host's `host_chips` chips.

    `chip_bounds`: None for the first of `share_settings`, NO_CHIP_BOUNDS for Ray's chips alone, or a setting to
    use (one that worked, `aha tpu-check` or the run's first psum). A process holding a whole 4-chip host of a slice
    also gets the GKE plugin's one-host variables (orchestration/cluster/tpu_gke.py): without them its libtpu would
    read the whole slice from the VM's metadata and wait for the other hosts.
    """
    env = {
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": str(port),
        "TPU_RUNTIME_METRICS_PORTS": str(metrics_port(port)),
        "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "CLOUD_TPU_TASK_ID": "0",
        # The older name, which Ray writes for 1- and 2-chip shares (tpu.py:52-56, 857-869): kept equal to the above so no
        # stale value of its can disagree with ours.
        "TPU_HOST_BOUNDS": "1,1,1",
    }
    host = host_chips or host_size(generation)
    if chips >= host:
        if host != CHIPS_PER_HOST_MULTIHOST or generation is None:
            return env  # a whole single-host VM: libtpu's own description of it is right (and its metadata is)
        axes = AXES.get(generation, 2)
        block = HOST_BLOCK[axes]
        env |= slice_env(generation, block, block, axes, 0, ["localhost"])
        chip_bounds = env["TPU_CHIPS_PER_HOST_BOUNDS"]
    elif chip_bounds is None:
        chip_bounds = share_bounds(generation, chips, host)
    if chip_bounds:
        env |= {"TPU_CHIPS_PER_PROCESS_BOUNDS": chip_bounds, "TPU_CHIPS_PER_HOST_BOUNDS": chip_bounds}
    return env


def subslice_env(hosts: SliceLayout, process: int, addresses: list[str], generation: str | None = None
                 ) -> dict[str, str]:
    """Process `process` of a learner over the hosts of `hosts`; `addresses[i]` is process i's "ip:port". With the
    generation known, also the GKE plugin's variables for the sub-slice (tpu_gke.py), from the same coordinates."""
    if len(addresses) != len(hosts.places):
        raise ValueError(f"{len(hosts.places)} learner hosts were placed but {len(addresses)} addresses given")
    ordered = [addresses[i] for i in hosts.in_task_order()]
    port = int(addresses[process].rsplit(":", 1)[1])
    env = {}
    if generation is not None:
        axes = AXES.get(generation, 2)
        dims = tuple(g * b for g, b in zip(hosts.grid, hosts.block))[:axes]
        env = slice_env(generation, dims, hosts.block, axes, hosts.task_ids[process],
                        [a.rsplit(":", 1)[0] for a in ordered])
    return env | {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": bounds(hosts.block),
        "TPU_PROCESS_BOUNDS": bounds(hosts.grid),
        "TPU_PROCESS_PORT": str(port),
        "TPU_RUNTIME_METRICS_PORTS": str(metrics_port(port)),
        "TPU_PROCESS_ADDRESSES": ",".join(ordered),
        "CLOUD_TPU_TASK_ID": str(hosts.task_ids[process]),
        "TPU_CHIPS_PER_HOST_BOUNDS": bounds(hosts.block),
        "TPU_HOST_BOUNDS": bounds(hosts.grid),
    }


def learner_envs(topology: str, hosts: int, chips: float, host_ips: list[str] | None = None,
                 host_chips: list | None = None, host_size_chips: int | None = None,
                 chip_bounds: str | None = None) -> list[dict[str, str]]:
    """The TPU environment of each learner process ({} each when the learner has no TPU chips).

    With hosts > 1: `host_ips[i]` and `host_chips[i]` are the node address and the chip coordinates of process i's
    placement bundle (orchestration/cluster/placement.py reads them). With one host: `host_size_chips` is the chips
    of its host when known (Ray's `TPU` resource of the node), `chip_bounds` as for `isolated_env`.
    """
    if not chips:
        return [{} for _ in range(hosts)]
    if hosts == 1:
        return [isolated_env(int(chips), BASE_PORT, generation_of(topology), host_size_chips, chip_bounds)]
    if host_ips is None or host_chips is None or not len(host_ips) == len(host_chips) == hosts:
        raise ValueError(f"learner.hosts={hosts} on TPU needs one placed host (address and chip coordinates) per "
                         f"process (got {host_ips})")
    grid = layout(host_chips)
    named = Topology.parse(topology)
    if named is not None and math.prod(grid.grid) * math.prod(grid.block) != named.chips:
        raise ValueError(f"learner.topology {topology} has {named.chips} chips but the placed hosts hold "
                         f"{math.prod(grid.grid) * math.prod(grid.block)}")
    addresses = [f"{ip}:{BASE_PORT + i}" for i, ip in enumerate(host_ips)]
    return [subslice_env(grid, i, addresses, generation_of(topology)) for i in range(hosts)]


def engine_envs(replicas: int, chips: float, learner_hosts: int, generation: str | None = None,
                host_chips: int | None = None, chip_bounds: str | None = None) -> list[dict[str, str]]:
    """The TPU environment of each engine replica's server actor (its engine process inherits it); {} off TPU.
    Without `host_chips` known, a run whose learner spans hosts is on a multi-host slice of 4-chip hosts."""
    if not chips:
        return [{} for _ in range(replicas)]
    host = host_chips or host_size(generation, learner_hosts > 1)
    return [isolated_env(int(chips), BASE_PORT + learner_hosts + i, generation, host, chip_bounds)
            for i in range(replicas)]
