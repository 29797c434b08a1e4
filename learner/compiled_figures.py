"""XLA's memory and cost analyses of a compiled step piece, kept on disk under the program they describe.

Preflight compiles the step for a TPU topology only to read these two analyses. JAX's persistent compilation cache
cannot serve it there: it keeps executables, and without a TPU client one cannot be read back. The analyses are a
function of what the compiler was given (the lowered program with its shardings, the devices it is compiled for, the
compiler's build, the flags in the environment) and of nothing else, so they are kept under a hash of exactly that:
a second preflight of a step that did not change reads them instead of compiling for minutes, and any change to the
step, the topology, the compiler or its flags compiles again. A compile the compiler refuses (out of HBM) raises as
before and is not kept.

Two folders hold them (`FigureStore`):
- the shipped figures (`configs/preflight_figures/`, committed): the TPU pieces of every shipped config, so a fresh
  machine (a new clone, CI) pays no TPU compile while the step is unchanged. Only TPU pieces: a TPU topology is the
  same on every machine, a CPU compile is for the host it runs on. A refresh (`aha preflight --refresh-figures`)
  writes them anew; a preflight of a shipped config reports the pieces they lack (`misses`), which is how a change to
  the step names the stale entries;
- the machine's own (`$AHA_CACHE/preflight/figures`): everything else a preflight compiled here.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax

MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes")
# What changes a compile besides the program: the compiler's flags.
FLAG_VARIABLES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
SHIPPED = Path(__file__).resolve().parents[1] / "configs" / "preflight_figures"


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
    """Hash of what a compile of `lowered` for `devices` depends on (no file paths: the same in every clone)."""
    client = devices[0].client
    parts = [lowered.as_text(), str(len(devices)), str(devices[0].device_kind), client.platform,
             client.platform_version, jax.__version__,
             *(f"{name}={os.environ.get(name, '')}" for name in FLAG_VARIABLES)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _read(path: Path) -> Figures | None:
    """The figures kept at `path`, or None (absent or unreadable: compiled again and replaced)."""
    try:
        kept = json.loads(path.read_text())
        return Figures({f: int(kept["memory"][f]) for f in MEMORY_FIELDS}, {k: float(v) for k, v in kept["cost"].items()})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, figures: Figures, label: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    entry = {"piece": label, "memory": figures.memory, "cost": figures.cost}
    partial.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    partial.replace(path)  # whole or absent: a preflight beside this one never reads half an entry


@dataclass
class FigureStore:
    """Where a preflight reads and keeps its pieces' figures (see the module docstring).

    `shipped`: the committed figures, read for pieces on `shipped_platforms`; `kept`: this machine's folder (None:
    keep nothing here); `refresh`: write the pieces `shipped` lacks there too (a refresh compiles only what
    changed); `used` records the shipped entries read or written, so a refresh can prune the rest."""

    shipped: Path | None = SHIPPED
    kept: Path | None = None
    refresh: bool = False
    shipped_platforms: tuple[str, ...] = ("tpu",)
    misses: list[str] = field(default_factory=list)
    """Labels of the pieces on a shipped platform that the shipped figures lacked (compiled or read from `kept`)."""
    used: set[str] = field(default_factory=set)
    """Keys of the shipped entries read or written."""

    def figures(self, lowered: Any, devices: list, label: str) -> Figures:
        """The analyses of `lowered` compiled for `devices`: read back where kept, else compiled and kept."""
        key = program_key(lowered, devices)
        ships = self.shipped is not None and devices[0].client.platform in self.shipped_platforms
        if ships and (found := _read(self.shipped / f"{key}.json")) is not None:
            self.used.add(key)
            return found
        if ships:
            self.misses.append(label)
        found = _read(self.kept / f"{key}.json") if self.kept is not None else None
        figures = found or Figures.of(lowered.compile())
        if ships and self.refresh:  # the same program's figures, wherever they came from
            _write(self.shipped / f"{key}.json", figures, label)
            self.used.add(key)
        elif found is None and self.kept is not None:
            _write(self.kept / f"{key}.json", figures, label)
        return figures
