"""RewardPool: run the user's reward functions (config `fn:` terms) in worker processes, never in the driver.

A user's scorer reads hostile model output and may itself be buggy or hostile; whatever one call does, the run goes
on, and nothing it started outlives it:
- raises (or returns something other than a list of numbers): the call fails as `raised` / `invalid`;
- hangs past `timeout_s` (a sleep, `signal.pause` with SIGTERM ignored, a C loop that holds the GIL, a fork bomb
  spinning at its task bound): the worker and everything it started are SIGKILLed and the worker replaced, the
  call fails as `timeout`;
- exits its process (`os._exit`, a segfault, the OOM killer): the call fails as `crash`, the worker is replaced;
- allocates past `memory_mb` (RLIMIT_DATA in the worker): MemoryError, the call fails as `memory`, the worker is
  replaced (it may be half-broken);
- sends a reply over MAX_REPLY_BYTES (or not JSON): `invalid`, the worker is replaced;
- floods its stderr: the pool logs at most so much per call (rewards/worker_log.py).
The caller (rewards/registry.py RewardSet) scores a failed call's samples per `rewards.on_error` and counts the
kinds. Calls are spread over the idle workers, so the groups of one step are scored in parallel.

Every worker lives in the pool's container (rewards/containment.py: a cgroup where the machine allows one), so a
killed or crashed worker takes all it started with it (a `setsid` daemon too), and so does a closed pool, or a
driver that dies. Each worker confines itself before it runs user code (rewards/confinement.py): task, file-size,
open-file and memory limits, and an unprivileged user when the driver is root.

Workers are `python -m rewards.worker` subprocesses, not multiprocessing or Ray workers: they start from nothing
(no fork of a driver that holds Ray and JAX threads), with the driver's sys.path and working directory, so a reward
module is importable in them exactly as in the driver (PYTHONPATH, the run's working directory, `ray job submit
--working-dir`, or a Ray worker's runtime_env working_dir).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
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

from rewards.config import RewardPoolConfig
from rewards.confinement import task_count
from rewards.containment import Containment, settle, setup_containment
from rewards.worker_log import WorkerLog

log = logging.getLogger(__name__)

FAILURE_KINDS = ("raised", "invalid", "timeout", "crash", "memory")
"""Ways a reward call fails; each is counted as `reward/errors/<kind>`."""
MAX_REPLY_BYTES = 64 << 20
START_TIMEOUT_S = 120.0
"""Longest a worker may take to start and import the reward modules."""
LOG_DRAIN_S = 2.0
"""Longest closing a worker waits for its log thread to read the last of its output."""
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
    """One worker process, the driver's end of its pipe, and the thread that logs its stderr."""

    def __init__(self, init: dict[str, Any], box: Containment, slot: int):
        self.box, self.slot = box, slot
        self.as_whom = "" if init["user"] is None else (
            f", by uid {init['user'][0]}: the driver is root, so the workers run as rewards.pool.user, which needs "
            "read access to the module's folder (chmod o+rx) and files")
        self.conn, child = Pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(init["sys_path"]), **box.env(slot)}
        for name in THREAD_VARS:  # one call at a time: a scorer's math library needs no thread per core
            env.setdefault(name, "1")
        join = box.join(slot)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rewards.worker", str(child.fileno())], pass_fds=(child.fileno(),), env=env,
            cwd=os.getcwd(), start_new_session=True, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        child.close()
        box.started(slot, self.proc.pid)
        self.exited = os.pidfd_open(self.proc.pid)  # readable once the worker has exited
        self.log = WorkerLog(os.dup(self.proc.stderr.fileno()), self.proc.pid)
        self.proc.stderr.close()
        self.conn.send({**init, "join": join})
        self.killed = False

    def wait_ready(self, where: dict[int, str]) -> None:
        """Block until the worker has imported every function; RewardImportError names the one that failed."""
        if not wait([self.conn, self.exited], START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"a reward worker did not start within {START_TIMEOUT_S:.0f} s (importing the reward "
                               "modules); check that they import quickly")
        try:
            if not self.conn.poll():
                raise EOFError
            reply = json.loads(self.conn.recv_bytes(MAX_REPLY_BYTES))
        except (EOFError, OSError):
            line = self.exit_line()
            self.log.join(2.0)
            raise RuntimeError(f"a reward worker died while starting ({line}); its last line: {self.log.last!r}")
        if "import_error" in reply:
            self.kill()
            key = int(reply["import_error"])
            raise RewardImportError(f"{where[key]}: cannot load it: {reply['message']}; it must be importable from "
                                    f"PYTHONPATH or the working directory ({os.getcwd()}){self.as_whom}")

    def kill(self) -> None:
        """SIGKILL the worker and everything it started (its container slot); reap it."""
        self.killed = True
        self.stop()
        killed = self.box.kill(self.slot)
        self.close()  # reaps the worker, whose dead children then go to init to be reaped
        settle(killed)

    def stop(self) -> None:
        """SIGKILL the worker itself first: one still starting has not joined its group yet, and a kill of the
        group alone would miss it (and leave the group behind when it joins after the group is removed)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def close(self) -> None:
        self.proc.wait()
        # Its log thread reports the output dropped since the last call when it reads the pipe's end; wait for it
        # (briefly: a grandchild outside the container could hold the pipe open), so that line is in the run's log
        # before the pool is closed rather than racing the driver's exit.
        self.log.join(LOG_DRAIN_S)
        self.conn.close()
        if self.exited >= 0:
            os.close(self.exited)
            self.exited = -1

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
    """`cfg.workers` processes that run the functions `fns` ({key: "package.module:function"}) call by call.

    `containment` picks the container (rewards/containment.py): "auto" takes the strongest this machine offers."""

    def __init__(self, fns: dict[int, str], where: dict[int, str], cfg: RewardPoolConfig | None = None,
                 containment: str = "auto"):
        cfg = cfg or RewardPoolConfig()
        self.timeout_s = cfg.timeout_s
        self._where = where
        user = worker_user(cfg.user)
        cwd = os.getcwd()
        self._init = {"fns": dict(fns), "user": user, "limits": limits(cfg, user), "network": cfg.network,
                      "sys_path": [cwd, *(p or cwd for p in sys.path if p != cwd)]}
        self._workers: list[_Worker] = []
        self._slots = iter(range(1 << 30))
        self.box = setup_containment(cfg.max_tasks, containment)
        self._finalizer = weakref.finalize(self, self.box.close)  # if close() is never called
        log.info("reward pool: %d workers (as uid %s), contained by %s, %s", cfg.workers,
                 os.getuid() if user is None else user[0], self.box.describe(),
                 "on the host's network (rewards.pool.network: true)" if cfg.network else
                 "with no network (each in an empty network namespace; rewards.pool.network: true gives them the "
                 "host's)")
        try:
            for _ in range(cfg.workers):
                self._workers.append(_Worker(self._init, self.box, next(self._slots)))
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
            # A reply, or the worker's exit: a process it started may hold its pipe open, so no EOF comes.
            exits = {worker.exited: conn for conn, (worker, _, _) in busy.items()}
            ready = wait([*busy, *exits], timeout=max(0.0, soonest - time.monotonic()))
            for conn in dict.fromkeys(exits.get(r, r) for r in ready):
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
        worker.log.new_call()
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
        if not worker.conn.poll():  # it exited without a reply
            return Outcome(None, "crash", f"worker process {worker.exit_line()}; replaced"), False
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
            worker.kill()  # reap it, and end what it started (it may still be exiting after a MemoryError)
        fresh = _Worker(self._init, self.box, next(self._slots))
        self._workers[self._workers.index(worker)] = fresh
        fresh.wait_ready(self._where)
        return fresh

    def worker_pids(self) -> list[int]:
        """The worker processes' ids (what a test's hold at the score phase stops, orchestration/faults.py)."""
        return [worker.proc.pid for worker in self._workers]

    def close(self) -> None:
        """Kill every worker and all they started, remove the container (idempotent)."""
        for worker in self._workers:
            worker.killed = True
            worker.stop()
        killed = self._finalizer() or set()
        for worker in self._workers:
            worker.close()
        self._workers = []
        settle(killed)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def worker_user(user: str | int) -> tuple[int, int] | None:
    """(uid, gid) the workers switch to: `user`'s when the driver is root, None when they keep the driver's user.
    A number needs no entry in /etc/passwd (its group is its passwd group, else the same number)."""
    if os.geteuid() != 0:
        return None
    if isinstance(user, int) or user.isdigit():
        uid = int(user)
        gid = next((p.pw_gid for p in pwd.getpwall() if p.pw_uid == uid), uid)
    else:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"rewards.pool.user {user!r} is no user on this machine; name one (nobody), give a "
                             "number, or create it (useradd --system NAME)") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    return None if uid == 0 else (uid, gid)


def limits(cfg: RewardPoolConfig, user: tuple[int, int] | None) -> dict[str, int]:
    """The resource limits every worker sets on itself (rewards/confinement.py), by `resource` constant name."""
    tasks = task_count(os.getuid() if user is None else user[0]) + cfg.max_tasks
    return {"RLIMIT_DATA": cfg.memory_mb << 20, "RLIMIT_NPROC": tasks, "RLIMIT_FSIZE": cfg.max_file_mb << 20,
            "RLIMIT_NOFILE": cfg.max_open_files}
