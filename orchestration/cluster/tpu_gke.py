"""The slice variables Google's GKE TPU device plugin gives a container, so libtpu never asks the VM's metadata.

On a TPU VM, libtpu reads the slice it belongs to (its topology, every worker's address, its own worker number) from
the VM's metadata server unless `TPU_SKIP_MDS_QUERY` is set. A process that is a cluster of its own on one host of a
multi-host slice (an engine replica on a v5e-16 host), or a learner over a sub-slice of it (2 of its 4 hosts), would
then take the whole 4-host slice as its own and wait for hosts that never join. GKE runs TPU containers on such hosts
every day, and its device plugin sets these variables for them instead; the rules here are its rules, copied from
GoogleCloudPlatform's tpu-device-plugin `pkg/util` (`InitEnvs`, `addPodsliceOrSliceEnvs`, `addSingleHostEnvs`,
`convertAcceleratorType`, `numCores`, `wrap`, `wrapLitePod`, `getChipsPerDim`; its `TestInitEnvs` table is the
unit test's reference, tests/unit/test_tpu_gke.py):

- `TPU_SKIP_MDS_QUERY=true` always;
- `TPU_TOPOLOGY`: the (sub-)slice's chips along x, y[, z] ("2x2" for one 4-chip host; a sub-slice's shape for a
  sub-slice, the plugin's `SubSliceTopology`);
- `TPU_ACCELERATOR_TYPE`: "<generation>-<cores>", v5e named "v5litepod", one core per chip on v5e and v6e, two on
  v4 and v5p (v5litepod-4, v6e-16, v4-16);
- `TPU_HOST_BOUNDS` = the topology divided by the host's block, `TPU_CHIPS_PER_HOST_BOUNDS` = the host's block
  (4 chips: 2,2,1);
- `TPU_TOPOLOGY_WRAP`: a v5e or v6e axis of 16 chips wraps; a v4 or v5p slice of at least 4x4x4 wraps on every
  axis; `TPU_TOPOLOGY_ALT=false`;
- one host alone: `TPU_WORKER_ID=0`, `TPU_WORKER_HOSTNAMES=localhost`. For several hosts the plugin leaves these
  to the workload's controller (JobSet / KubeRay's TPU webhook): every member's hostname in worker order and its own
  number. Here that order is libtpu's task order (orchestration/cluster/tpu_layout.py), the same as CLOUD_TPU_TASK_ID.

Nothing here imports Ray or JAX.
"""

from __future__ import annotations

import math

GKE_GENERATION = {"v5e": "v5litepod"}
"""The plugin's generation names where they differ from JAX's (`AcceleratorGen`: tpu-v5-lite-podslice -> v5litepod)."""
ONE_CORE_PER_CHIP = ("v5e", "v6e")
"""`numCores`: lite chips (v5e) and v6e have one core each, every other generation two."""
LITE_WRAP_DIM = 16
"""`wrapLitePod`: an axis of a v5e or v6e topology wraps around when it is 16 chips long (`vlpMaxTopologyDim`)."""


def accelerator_type(generation: str, dims: tuple[int, ...]) -> str:
    """`convertAcceleratorType`: v5litepod-4, v6e-16, v4-16 (cores, not chips, on v4 / v5p)."""
    chips = math.prod(dims)
    cores = chips if generation in ONE_CORE_PER_CHIP else 2 * chips
    return f"{GKE_GENERATION.get(generation, generation)}-{cores}"


def wrap(generation: str, dims: tuple[int, ...]) -> str:
    """`wrap`: which axes of the topology are tori."""
    padded = (*dims, 1, 1, 1)[:3]
    if generation in ONE_CORE_PER_CHIP:
        return ",".join("true" if d == LITE_WRAP_DIM else "false" for d in padded)
    return ",".join(["true" if min(padded) >= 4 else "false"] * 3)


def topology_name(dims: tuple[int, ...], axes: int) -> str:
    """The topology as the plugin and libtpu write it: "4x2" for 2-D generations, "2x2x2" for 3-D ones."""
    return "x".join(str(d) for d in (*dims, 1, 1, 1)[:axes])


def slice_env(generation: str, dims: tuple[int, ...], block: tuple[int, ...], axes: int, worker: int,
              hostnames: list[str]) -> dict[str, str]:
    """The plugin's variables for one process of a (sub-)slice of `dims` chips whose hosts hold `block` each;
    `hostnames` are all its hosts in worker order (["localhost"] for one host), `worker` this process's number."""
    dims3, block3 = (*dims, 1, 1, 1)[:3], (*block, 1, 1, 1)[:3]
    if any(d % b for d, b in zip(dims3, block3)):
        raise ValueError(f"a {topology_name(dims, axes)} topology does not split into hosts of "
                         f"{topology_name(block, 3)} chips")
    return {
        "TPU_SKIP_MDS_QUERY": "true",
        "TPU_TOPOLOGY": topology_name(dims, axes),
        "TPU_ACCELERATOR_TYPE": accelerator_type(generation, dims3),
        "TPU_TOPOLOGY_WRAP": wrap(generation, dims3),
        "TPU_TOPOLOGY_ALT": "false",
        "TPU_HOST_BOUNDS": ",".join(str(d // b) for d, b in zip(dims3, block3)),
        "TPU_CHIPS_PER_HOST_BOUNDS": ",".join(map(str, block3)),
        "TPU_WORKER_ID": str(worker),
        "TPU_WORKER_HOSTNAMES": ",".join(hostnames),
    }
