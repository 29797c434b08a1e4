"""What one accelerator chip offers: HBM, peak bf16 matmul FLOP/s, HBM bandwidth (for preflight's estimates).

Per-chip figures from Google Cloud's TPU system-architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p,
/v6e; "Chip specifications" tables), as published in 2025:
  v4:  32 GiB HBM2,   275 TFLOP/s bf16, 1200 GB/s
  v5e: 16 GiB HBM2,   197 TFLOP/s bf16,  819 GB/s
  v5p: 95 GiB HBM2e,  459 TFLOP/s bf16, 2765 GB/s
  v6e: 32 GiB HBM,    918 TFLOP/s bf16, 1640 GB/s
A v4 chip has two TensorCores; a topology description may list one device per core, so the per-device share is
the chip's figure divided by the devices that sit at the same chip coordinates (see `per_device`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes: int
    peak_flops: float  # bf16 FLOP/s; 0 = unknown (CPU)
    hbm_bandwidth: float  # bytes/s; 0 = unknown


CHIPS = {
    "v4": Chip("TPU v4", 32 * GIB, 275e12, 1200e9),
    "v5e": Chip("TPU v5e", 16 * GIB, 197e12, 819e9),
    "v5p": Chip("TPU v5p", 95 * GIB, 459e12, 2765e9),
    "v6e": Chip("TPU v6e", 32 * GIB, 918e12, 1640e9),
}


def host_memory_bytes() -> int:
    """Physical memory of this machine (what CPU 'devices' share)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def chip_for(topology: str | None) -> Chip:
    """The chip of a topology name such as "v5e:2x2"; None/"cpu" = this host's memory, no peak figures."""
    if topology in (None, "cpu"):
        return Chip("CPU host", host_memory_bytes(), 0.0, 0.0)
    kind = topology.split(":", 1)[0]
    if kind not in CHIPS:
        raise ValueError(f"learner.topology {topology!r}: chip {kind!r} unknown; use one of {sorted(CHIPS)} "
                         "(e.g. v5e:2x2), or cpu")
    return CHIPS[kind]


def per_device(chip: Chip, devices: list) -> Chip:
    """The chip's figures divided among the devices that share one chip (v4 lists one device per core)."""
    coords = [tuple(getattr(d, "coords", ())) for d in devices]
    share = max(len(coords) // max(len(set(coords)), 1), 1) if all(coords) else 1
    if chip.name == "CPU host":
        share = len(devices)  # forced host devices split one machine's memory
    return Chip(chip.name, chip.hbm_bytes // share, chip.peak_flops / share, chip.hbm_bandwidth / share)
