"""RewardPool: run the user's reward functions (config `fn:` terms) in worker processes, never in the driver.

A user's scorer reads hostile model output and may itself be buggy; whatever one call does, the run goes on:
- raises (or returns something other than a list of numbers): the call fails as `raised` / `invalid`;
- hangs past `timeout_s`: its worker's process group is SIGKILLed and replaced, the call fails as `timeout`;
- exits its process (`os._exit`, a segfault, the OOM killer): the call fails as `crash`, the worker is replaced;
- allocates past `memory_mb` (RLIMIT_DATA in the worker): MemoryError, the call fails as `memory`, the worker is
  replaced (it may be half-broken).
The caller (rewards/registry.py RewardSet) scores a failed call's samples per `rewards.on_error` and counts the
kinds. Calls are spread over the idle workers, so the groups of one step are scored in parallel.

Workers are `python -m rewards.worker` subprocesses, not multiprocessing or Ray workers: they start from nothing
(no fork of a driver that holds Ray and JAX threads), with the driver's sys.path and working directory, so a reward
module is importable in them exactly as in the driver (PYTHONPATH, the run's working directory, `ray job submit
--working-dir`, or a Ray worker's runtime_env working_dir).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from typing import Any

log = logging.getLogger(__name__)

FAILURE_KINDS = ("raised", "invalid", "timeout", "crash", "memory")
"""Ways a reward call fails; each is counted as `reward/errors/<kind>`."""
MAX_REPLY_BYTES = 64 << 20
START_TIMEOUT_S = 120.0
"""Longest a worker may take to start and import the reward modules."""
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class RewardImportError(ValueError):
    """A reward function could not be imported in a worker: a config error, said in one line."""


@dataclass
class Call:
    """One call of a reward function: the function's key in the pool and TRL's keyword arguments."""

    fn: int
    kwargs: dict[str, Any]

    @property
    def size(self) -> int:
        return len(self.kwargs["completions"])


@dataclass
class Outcome:
    """What a call gave: one value per completion (None: the function declined), or a failure kind and its line."""

    values: list[float | None] | None
    kind: str | None = None
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    """Means of what the function logged through TRL's `log_metric`."""


class _Worker:
    """One worker process and the driver's end of its pipe."""

    def __init__(self, init: dict[str, Any]):
        self.conn, child = Pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(init["sys_path"])}
        for name in THREAD_VARS:  # one call at a time: a scorer's math library needs no thread per core
            env.setdefault(name, "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rewards.worker", str(child.fileno()), str(os.getpid())],
            pass_fds=(child.fileno(),), env=env, cwd=os.getcwd(), start_new_session=True, stdin=subprocess.DEVNULL)
        child.close()
        self.conn.send(init)
        self.killed = False

    def wait_ready(self, where: dict[int, str]) -> None:
        """Block until the worker has imported every function; RewardImportError names the one that failed."""
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"a reward worker did not start within {START_TIMEOUT_S:.0f} s (importing the reward "
                               "modules); check that they import quickly")
        try:
            reply = json.loads(self.conn.recv_bytes(MAX_REPLY_BYTES))
        except (EOFError, OSError):
            raise RuntimeError(f"a reward worker died while starting ({self.exit_line()}); its log is on stderr")
        if "import_error" in reply:
            self.kill()
            key = int(reply["import_error"])
            raise RewardImportError(f"{where[key]}: cannot load it: {reply['message']}; it must be importable from "
                                    f"PYTHONPATH or the working directory ({os.getcwd()})")

    def kill(self) -> None:
        self.killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: any children it started go too
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.conn.close()

    def exit_line(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code >= 0:
            return f"exited with code {code}"
        name = signal.Signals(-code).name
        return f"killed by {name}" + (" (the kernel's OOM killer?)" if name == "SIGKILL" and not self.killed else "")


class RewardPool:
    """`workers` processes that run the functions `fns` ({key: "package.module:function"}) call by call."""

    def __init__(self, fns: dict[int, str], where: dict[int, str], workers: int = 2, timeout_s: float = 30.0,
                 memory_mb: int = 2048):
        self.timeout_s = timeout_s
        self._where = where
        cwd = os.getcwd()
        self._init = {"fns": dict(fns), "memory_mb": memory_mb,
                      "sys_path": [cwd, *(p or cwd for p in sys.path if p != cwd)]}
        self._workers: list[_Worker] = []
        self._procs: list[subprocess.Popen] = []  # for the finalizer: kill whatever is left if close() is never called
        self._finalizer = weakref.finalize(self, _kill_all, self._procs)
        try:
            self._workers = [_Worker(self._init) for _ in range(workers)]
            self._procs[:] = [w.proc for w in self._workers]
            for worker in self._workers:
                worker.wait_ready(where)
        except BaseException:
            self.close()
            raise

    def run(self, calls: Sequence[Call]) -> list[Outcome]:
        """Every call's outcome, in order; calls run in parallel on the idle workers."""
        results: list[Outcome | None] = [None] * len(calls)
        pending = deque(range(len(calls)))
        idle = deque(self._workers)
        busy: dict[Connection, tuple[_Worker, int, float]] = {}  # conn -> (worker, call number, deadline)
        while pending or busy:
            while pending and idle:
                number, worker = pending.popleft(), idle.popleft()
                worker = self._send(worker, number, calls[number])
                busy[worker.conn] = (worker, number, time.monotonic() + self.timeout_s)
            soonest = min(deadline for _, _, deadline in busy.values())
            for conn in wait(list(busy), timeout=max(0.0, soonest - time.monotonic())):
                worker, number, _ = busy.pop(conn)
                results[number], healthy = self._receive(worker, calls[number])
                idle.append(worker if healthy else self._replace(worker))
            now = time.monotonic()
            for conn, (worker, number, deadline) in list(busy.items()):
                # An answer that arrived while this loop was busy (starting a replacement) is no timeout.
                if now >= deadline and not conn.poll():
                    del busy[conn]
                    worker.kill()
                    results[number] = Outcome(None, "timeout", f"no answer within {self.timeout_s:g} s "
                                              "(rewards.pool.timeout_s); worker killed and replaced")
                    idle.append(self._replace(worker))
        return results  # type: ignore[return-value]

    def _send(self, worker: _Worker, number: int, call: Call) -> _Worker:
        """Send a call; a worker found dead while idle is replaced and the call sent to the new one."""
        try:
            worker.conn.send((number, call.fn, call.kwargs))
            return worker
        except (BrokenPipeError, ConnectionResetError, OSError):
            log.warning("reward worker %d was dead before a call (%s); replaced", worker.proc.pid, worker.exit_line())
            worker = self._replace(worker)
            worker.conn.send((number, call.fn, call.kwargs))
            return worker

    def _receive(self, worker: _Worker, call: Call) -> tuple[Outcome, bool]:
        """The call's outcome from the worker's reply, and whether the worker can take another call."""
        try:
            reply = json.loads(worker.conn.recv_bytes(MAX_REPLY_BYTES))
        except (EOFError, ConnectionResetError):
            return Outcome(None, "crash", f"worker process {worker.exit_line()}; replaced"), False
        except (OSError, ValueError) as exc:  # a reply over MAX_REPLY_BYTES, or not JSON
            worker.kill()
            return Outcome(None, "invalid", f"unreadable reply ({exc!r:.100}); worker replaced"), False
        if "kind" in reply:
            kind = reply["kind"] if reply["kind"] in FAILURE_KINDS else "invalid"
            return Outcome(None, kind, str(reply.get("message", ""))[:300]), kind != "memory"
        values = reply.get("values")
        if not isinstance(values, list) or len(values) != call.size or \
                not all(v is None or isinstance(v, (int, float)) for v in values):
            return Outcome(None, "invalid", "malformed reply from the worker"), True
        metrics = {str(k): float(v) for k, v in dict(reply.get("metrics") or {}).items() if isinstance(v, (int, float))}
        return Outcome([None if v is None else float(v) for v in values], metrics=metrics), True

    def _replace(self, worker: _Worker) -> _Worker:
        if not worker.killed:
            worker.kill()  # reap it (it may still be exiting after a MemoryError)
        fresh = _Worker(self._init)
        self._workers[self._workers.index(worker)] = fresh
        self._procs[:] = [w.proc for w in self._workers]
        fresh.wait_ready(self._where)
        return fresh

    def close(self) -> None:
        """Stop every worker (idempotent): a closed pipe ends an idle worker; a busy one is killed."""
        for worker in self._workers:
            worker.conn.close()
        for worker in self._workers:
            try:
                worker.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                worker.kill()
        self._workers = []
        self._finalizer.detach()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
