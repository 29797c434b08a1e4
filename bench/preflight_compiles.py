"""Where a preflight's time goes: each step piece's compile, its wall and CPU seconds and its temporaries, then the
whole preflight's wall time. Every piece is compiled (`--recompile`: no kept figures), as on a fresh machine.

    env -u XLA_FLAGS .venv/bin/python bench/preflight_compiles.py \
        --config configs/countdown_qwen2.5-1.5b_tpu_v5e8.yaml --probe-layers

Takes preflight's own arguments. The suite's TPU checks (tests/integration/test_preflight.py) pay these compiles on a
machine without kept figures (docs/benchmarks.md, "The test suite's time").
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import learner.aot as aot  # noqa: E402
from orchestration.cli.preflight import main  # noqa: E402

GIB = 1 << 30


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(compile_figures):
    def compile_and_time(lowered, devices, folder):
        wall, cpu = time.perf_counter(), cpu_seconds()
        figures = compile_figures(lowered, devices, folder)
        print(f"compile: {time.perf_counter() - wall:6.1f} s wall {cpu_seconds() - cpu:6.1f} s CPU, temporaries "
              f"{figures.memory['temp_size_in_bytes'] / GIB:.2f} GiB", flush=True)
        return figures
    return compile_and_time


if __name__ == "__main__":
    aot.compile_figures = timed(aot.compile_figures)  # learner/aot.py calls it by this module's name
    start = time.perf_counter()
    code = main([*sys.argv[1:], "--recompile"])
    print(f"preflight: {time.perf_counter() - start:.1f} s wall", flush=True)
    sys.exit(code)
