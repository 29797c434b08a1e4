"""XLA's memory and cost analyses of a compiled step piece, kept on disk under the program they describe.

Preflight compiles the step for a TPU topology only to read these two analyses. JAX's persistent compilation cache
cannot serve it there: it keeps executables, and without a TPU client one cannot be read back. The analyses are a
function of what the compiler was given (the lowered program with its shardings, the devices it is compiled for, the
compiler's build, the flags in the environment) and of nothing else, so they are kept under a hash of exactly that:
a second preflight of a step that did not change reads them instead of compiling for minutes (docs/tpu.md: a
Qwen2.5-1.5B `--probe-layers` preflight, 172 s the first time, 6 s the second), and any change to the step, the topology, the compiler or
its flags compiles again. A compile the compiler refuses (out of HBM) raises as before and is not kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax

MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes")
# What changes a compile besides the program: the compiler's flags.
FLAG_VARIABLES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


@dataclass(frozen=True)
class Figures:
    """The two analyses of one compiled piece, with the accessors of a `jax.stages.Compiled`."""

    memory: dict[str, int]
    cost: dict[str, float]

    def memory_analysis(self) -> SimpleNamespace:
        return SimpleNamespace(**self.memory)

    def cost_analysis(self) -> dict[str, float]:
        return dict(self.cost)

    @classmethod
    def of(cls, compiled: Any) -> Figures:
        m = compiled.memory_analysis()
        cost = compiled.cost_analysis()
        cost = (cost[0] if isinstance(cost, list) else cost) or {}
        return cls({f: int(getattr(m, f)) for f in MEMORY_FIELDS},
                   {k: float(v) for k, v in cost.items() if isinstance(v, (int, float))})


def program_key(lowered: Any, devices: list) -> str:
    """Hash of what a compile of `lowered` for `devices` depends on."""
    client = devices[0].client
    parts = [lowered.as_text(), str(len(devices)), str(devices[0].device_kind), client.platform,
             client.platform_version, jax.__version__,
             *(f"{name}={os.environ.get(name, '')}" for name in FLAG_VARIABLES)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def compile_figures(lowered: Any, devices: list, folder: Path | None) -> Figures:
    """The analyses of `lowered` compiled for `devices`: read from `folder` if kept there, else compiled (and kept,
    when `folder` is given). An unreadable entry is compiled again and replaced."""
    if folder is None:
        return Figures.of(lowered.compile())
    path = Path(folder) / f"{program_key(lowered, devices)}.json"
    try:
        kept = json.loads(path.read_text())
        return Figures({f: int(kept["memory"][f]) for f in MEMORY_FIELDS}, {k: float(v) for k, v in kept["cost"].items()})
    except (OSError, ValueError, KeyError, TypeError):
        pass
    figures = Figures.of(lowered.compile())
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"memory": figures.memory, "cost": figures.cost}))
    partial.replace(path)  # whole or absent: a preflight beside this one never reads half an entry
    return figures
