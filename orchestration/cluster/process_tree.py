"""Nothing a run started outlives it: its driver adopts every orphaned descendant and ends what is left at exit.

Each part stops what it started (the engines their servers, `ray.shutdown()` the local cluster, an environment's host
its episodes), but some of those stops only begin an exit: a Ray worker leaves after it notices its raylet is gone,
a killed process is gone only once the kernel has torn it down. A driver that exits first leaves them running for a
moment, or for good when one hangs on the way out. So the driver of `aha train` and `aha tinker` becomes a child
subreaper (Linux: PR_SET_CHILD_SUBREAPER), which makes every orphaned descendant its child, and at exit, after
everything else has stopped, sends SIGTERM to what remains, SIGKILL after a grace, and waits until each is reaped.

Under `ray job submit` the cluster's processes are the cluster's (their parent is its raylet), not the driver's:
only what the driver itself started is ended.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import sys
import time

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_S = 5.0
"""Seconds what remains has to exit on SIGTERM before SIGKILL."""
KILL_WAIT_S = 60.0
"""Most seconds to wait for killed processes to be reaped (a process in the kernel's uninterruptible sleep)."""
POLL_S = 0.05


def own_descendants_until_exit() -> None:
    """Become the subreaper of everything this process starts, and end it all at interpreter exit.

    Call first thing in a CLI's main: atexit runs its handlers last-registered first, so this one runs after Ray's
    shutdown and every part's own close.
    """
    if not sys.platform.startswith("linux"):
        return  # no subreapers: each part's own stop is all there is (a laptop's run)
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("could not become a child subreaper (errno %d): a process the run started may outlive it",
                    ctypes.get_errno())
    atexit.register(end_descendants)


def descendants(root: int | None = None) -> list[int]:
    """Pids of the live (not zombie) processes below `root` (this process), children first."""
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
    found, frontier = [], [root or os.getpid()]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_children() -> None:
    """Collect every child that has exited (zombies keep their pid taken until then)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_gone(deadline: float) -> list[int]:
    """Reap until no descendant is left or the deadline passes; what is left."""
    while True:
        reap_children()
        left = descendants()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def end_descendants() -> None:
    """SIGTERM what this process's descendants are still running, SIGKILL it after a grace, and wait it out."""
    left = descendants()
    if not left:
        reap_children()
        return
    signal_all(left, signal.SIGTERM)
    left = wait_gone(time.monotonic() + TERM_GRACE_S)
    deadline = time.monotonic() + KILL_WAIT_S
    while left and time.monotonic() < deadline:
        signal_all(left, signal.SIGKILL)  # again each round: a process orphaned since is ours now
        left = wait_gone(min(deadline, time.monotonic() + 1.0))
    if left:
        print(f"processes {left} of this run did not end within {KILL_WAIT_S:g} s of SIGKILL", file=sys.stderr)
