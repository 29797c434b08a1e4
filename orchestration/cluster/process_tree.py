"""Nothing a run started outlives it: while its parts stop, the driver adopts what they orphan, then ends what is left.

Each part stops what it started (the engines their servers, `ray.shutdown()` the local cluster, an environment's host
its episodes), but some of those stops only begin an exit: a Ray worker leaves after it notices its raylet is gone,
a killed process is gone only once it has been reaped. A driver that exits first leaves them running for a moment,
or for good when one hangs on the way out. So `aha train`, `tinker`, `eval` and `serve` stop their parts inside
`ending_what_it_started()`: the driver becomes a child subreaper (Linux: PR_SET_CHILD_SUBREAPER), so every process
orphaned meanwhile becomes its child; at the end what remains below it gets SIGTERM, SIGKILL after a grace, and is
reaped, and the driver stops being a subreaper.

Only while stopping: a subreaper for the whole run would adopt what the run's parts orphan on purpose (a reward's
daemon, a fork bomb's copies once the reward pool kills them), and their zombies, which nobody else would reap,
would count against the pool user's task limit until the run ends (tests/integration/test_user_task.py's daemon
reward found that: its fork failed with EAGAIN at step 2). Under `ray job submit` the cluster's processes are the
cluster's (their parent is its raylet): only what the driver itself started is ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_S = 5.0
"""Seconds what remains has to exit on SIGTERM before SIGKILL."""
KILL_WAIT_S = 60.0
"""Most seconds to wait for killed processes to be reaped (a process in the kernel's uninterruptible sleep)."""
POLL_S = 0.05


def set_subreaper(on: bool) -> bool:
    """Make this process the subreaper of its descendants' orphans (or stop); False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False  # no subreapers: each part's own stop is all there is (a laptop's run)
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        log.warning("could not %s a child subreaper (errno %d)", "become" if on else "stop being", ctypes.get_errno())
        return False
    return True


def already_running() -> frozenset[int]:
    """This process's descendants now: taken when a run starts, they are not the run's to end (a notebook's other
    subprocesses, a test's servers)."""
    return frozenset(descendants())


@contextlib.contextmanager
def ending_what_it_started(spare: frozenset[int] = frozenset()) -> Iterator[None]:
    """Stop the parts inside this: whatever they orphan is adopted, and what is left at the end (but the processes
    in `spare` and their own descendants) is ended and reaped."""
    adopting = set_subreaper(True)
    try:
        yield
    finally:
        end_descendants(spare)
        if adopting:
            set_subreaper(False)


def descendants(root: int | None = None, spare: frozenset[int] = frozenset()) -> list[int]:
    """Pids of the live (not zombie) processes below `root` (this process), children first; not the processes in
    `spare`, nor what is below them."""
    if not os.path.isdir("/proc"):
        return []  # no /proc (macOS): each part's own stop is all there is
    parents: dict[int, int] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{name}/stat", "rb").read()
        except OSError:  # gone since listed
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] != b"Z":
            parents[int(name)] = int(fields[1])
    found, frontier = [], {root or os.getpid()}
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in spare]
        found += children
        frontier = set(children)
    return found


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(pids: set[int]) -> None:
    """Collect those of `pids` that are this process's exited children (adopted ones included); not any other child,
    whose status its own Popen may still want."""
    for pid in list(pids):
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                pids.discard(pid)
        except ChildProcessError:  # not ours (yet), or reaped already
            pass


def wait_gone(deadline: float, spare: frozenset[int], ended: set[int]) -> list[int]:
    """Reap until no descendant (but `spare`) is left or the deadline passes; what is left."""
    while True:
        reap(ended)
        left = descendants(spare=spare)
        ended.update(left)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def end_descendants(spare: frozenset[int] = frozenset()) -> None:
    """SIGTERM what this process's descendants (but `spare`) still run, SIGKILL it after a grace, and wait it out."""
    left = descendants(spare=spare)
    if not left:
        return
    ended = set(left)
    signal_all(left, signal.SIGTERM)
    left = wait_gone(time.monotonic() + TERM_GRACE_S, spare, ended)
    deadline = time.monotonic() + KILL_WAIT_S
    while left and time.monotonic() < deadline:
        signal_all(left, signal.SIGKILL)  # again each round: a process orphaned since is ours now
        left = wait_gone(min(deadline, time.monotonic() + 1.0), spare, ended)
    reap(ended)
    if left:
        log.error("processes %s of this run did not end within %g s of SIGKILL", left, KILL_WAIT_S)
