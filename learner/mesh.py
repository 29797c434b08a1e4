"""The learner's mesh over its own slice of `jax.devices()`.

The rollout engine may share the host (and on a TPU VM, the chips): the learner takes `devices.count` devices
from `devices.offset` and lays them out as `mesh.axis_names` x `mesh.axis_sizes` (one size may be -1 = the
rest). Nothing here is CPU-specific: on a TPU slice `jax.devices()` are the chips Ray gave the actor.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh

from learner.config import DevicesConfig, MeshConfig


def select_devices(cfg: DevicesConfig, devices: list | None = None) -> list:
    """The learner's devices: `count` of them from `offset` (-1 = all the rest)."""
    devices = list(jax.devices() if devices is None else devices)
    count = len(devices) - cfg.offset if cfg.count == -1 else cfg.count
    if cfg.offset >= len(devices) or count < 1 or cfg.offset + count > len(devices):
        raise ValueError(
            f"learner.devices offset={cfg.offset} count={cfg.count} does not fit the {len(devices)} visible devices; "
            "lower them (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N devices)"
        )
    return devices[cfg.offset : cfg.offset + count]


def resolve_sizes(cfg: MeshConfig, n_devices: int) -> tuple[int, ...]:
    """Axis sizes with -1 replaced by what is left; raises if they do not multiply to n_devices."""
    known = math.prod(s for s in cfg.axis_sizes if s != -1)
    sizes = tuple(n_devices // known if s == -1 else s for s in cfg.axis_sizes)
    if math.prod(sizes) != n_devices:
        raise ValueError(
            f"learner.mesh axis_sizes {cfg.axis_sizes} over {cfg.axis_names} need {math.prod(sizes)} devices but the "
            f"learner has {n_devices}; make the sizes multiply to {n_devices} or use -1 for one axis"
        )
    return sizes


def learner_mesh(devices_cfg: DevicesConfig, mesh_cfg: MeshConfig, devices: list | None = None) -> Mesh:
    """A Mesh on the learner's device slice with the configured axes."""
    chosen = select_devices(devices_cfg, devices)
    sizes = resolve_sizes(mesh_cfg, len(chosen))
    return Mesh(np.asarray(chosen, dtype=object).reshape(sizes), mesh_cfg.axis_names)
