"""Where a preflight's time goes: each step piece's compile, its wall and CPU seconds and its temporaries, then the
whole preflight's wall time. Every piece is compiled (`--recompile`: neither the shipped figures nor the machine's).

    env -u XLA_FLAGS .venv/bin/python bench/preflight_compiles.py \
        --config configs/countdown_qwen2.5-1.5b_tpu_v5e8.yaml --probe-layers

Takes preflight's own arguments. These are the compiles the shipped figures (configs/preflight_figures/) spare a fresh
machine, and what `aha preflight --refresh-figures` pays for the pieces a change to the step made new.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.compiled_figures import FigureStore  # noqa: E402
from orchestration.cli.preflight import main  # noqa: E402

GIB = 1 << 30


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(figures_of):
    def compile_and_time(store, lowered, devices, label):
        wall, cpu = time.perf_counter(), cpu_seconds()
        figures = figures_of(store, lowered, devices, label)
        print(f"compile {label}: {time.perf_counter() - wall:6.1f} s wall {cpu_seconds() - cpu:6.1f} s CPU, temporaries "
              f"{figures.memory['temp_size_in_bytes'] / GIB:.2f} GiB", flush=True)
        return figures
    return compile_and_time


if __name__ == "__main__":
    FigureStore.figures = timed(FigureStore.figures)
    start = time.perf_counter()
    code = main([*sys.argv[1:], "--recompile"])
    print(f"preflight: {time.perf_counter() - start:.1f} s wall", flush=True)
    sys.exit(code)
