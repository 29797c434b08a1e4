"""Engine start-up benchmark: seconds from launch to /health for a vLLM server, per engine interpreter.

The server is started by the project's own launcher (`rollout.vllm_server.VllmBackend.start`, no Ray), on the
tiny model, once per interpreter per round, alternating so a busy machine slows every side alike. Prints the median
per interpreter and each one's ratio to the first. Made to compare an engine env with compiled bytecode against
one without (scripts/env_lib.sh: a process of an env without .pyc compiles torch and vLLM from source at import):

    .venv/bin/python bench/bench_engine_start.py --python ~/.cache/aha/envs/vllm-OLD/bin/python .venv-vllm/bin/python
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from orchestration.prepare_model import TINY, model_dir
from rollout.config import VllmConfig
from rollout.vllm_server import VllmBackend


def seconds_to_ready(python: str, model: Path) -> float:
    backend = VllmBackend(VllmConfig(python=python, max_model_len=512, kv_cache_space_gb=1), model)
    t0 = time.perf_counter()
    backend.start()
    elapsed = time.perf_counter() - t0
    backend.stop()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--python", nargs="+", required=True, help="engine interpreters to compare (first = baseline)")
    p.add_argument("--model", default=TINY)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    model = model_dir(args.model)
    times: dict[str, list[float]] = {py: [] for py in args.python}
    for _ in range(args.rounds):
        for py in args.python:
            times[py].append(seconds_to_ready(py, model))
            print(f"{py}: {times[py][-1]:.1f} s", flush=True)
    base = statistics.median(times[args.python[0]])
    for py, ts in times.items():
        median = statistics.median(ts)
        print(f"median {median:.1f} s  ratio to first {median / base:.2f}  {py}")


if __name__ == "__main__":
    main()
