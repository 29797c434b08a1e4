"""Where a reward pool's processes live, so that every one of them can be killed: whatever a worker starts, a
`setsid` daemon or a fork bomb included, dies with its worker and with the pool.

A process group or session is no boundary (a child leaves both with one `setsid` call), and PR_SET_PDEATHSIG
reaches only the worker itself. What holds instead, the best this machine offers:
- `cgroup2`: a cgroup v2 per pool under the driver's own, a child cgroup per worker (Linux >= 5.14, `cgroup.kill`).
  The worker moves itself into its cgroup before it runs any user code, so everything it starts is a member, and
  no member can move out (the cgroup files are root's); `cgroup.kill` ends them all at once.
- `cgroup1`: the same layout in the cgroup v1 `pids` hierarchy; `pids.max` bounds the pool's tasks as well, and a
  kill SIGKILLs every member until the group is empty (the bound keeps a fork bomb from outrunning it).
- `tree` (no writable cgroup: not root, or a read-only /sys/fs/cgroup): each worker is a child subreaper
  (PR_SET_CHILD_SUBREAPER), so its orphaned descendants stay its descendants, and every process it starts carries
  the pool's token in its environment; a kill SIGKILLs the worker's descendants and every process with the token
  until none is left. Weaker: a process that clears its environment and outlives its worker escapes.
The driver's own death runs no cleanup (SIGKILL, the OOM killer), so a keeper (this file run as a script, in a
session of its own) holds a pipe from the driver: when that pipe closes, it kills whatever the pool left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TOKEN_VAR = "AHA_REWARD_POOL"
"""Environment variable every worker (and what it starts) carries: the pool's token."""
KILL_WAIT_S = 10.0
"""Longest a kill waits for the members to be gone (a process in uninterruptible sleep can take a while)."""
SETTLE_S = 5.0
"""Longest `settle` waits for killed processes to be reaped."""


class Containment:
    """A pool's process container: `join(slot)` says how worker `slot` enters it, `kill(slot)` ends that worker
    with everything it started, `close()` ends all of them and removes the container. This base class is the
    `tree` kind."""

    kind = "tree"

    def __init__(self, token: str):
        self.token = token
        self.slots: dict[int, int] = {}  # slot -> worker pid (tree kills walk from it)
        self._keeper: subprocess.Popen | None = None

    def env(self, slot: int) -> dict[str, str]:
        """Environment variables of worker `slot`: the token that marks it and all it starts."""
        return {TOKEN_VAR: f"{self.token}:{slot}"}

    def join(self, slot: int) -> dict:
        """What worker `slot` does to itself before it runs user code (rewards/confinement.py reads it)."""
        return {"subreaper": True}

    def started(self, slot: int, pid: int) -> None:
        self.slots[slot] = pid

    def kill(self, slot: int) -> set[int]:
        """SIGKILL worker `slot` and everything it started; return once none runs, with the pids killed (`settle`
        waits for them to be reaped)."""
        pid = self.slots.pop(slot, None)
        mark = f"{TOKEN_VAR}={self.token}:{slot}".encode()
        return _kill_until_empty(lambda: members([pid] if pid else [], lambda entry: entry == mark))

    def kill_all(self) -> set[int]:
        roots, prefix = list(self.slots.values()), f"{TOKEN_VAR}={self.token}:".encode()
        self.slots.clear()
        return _kill_until_empty(lambda: members(roots, lambda entry: entry.startswith(prefix)))

    def describe(self) -> str:
        return "a subreaper per worker and the pool's token (no writable cgroup)"

    def keep(self) -> None:
        """Start the keeper: it kills whatever is left once the driver is gone, even by SIGKILL."""
        read, write = os.pipe()
        # -I: this file's folder stays off sys.path (rewards/types.py would shadow the stdlib's `types`).
        self._keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, self.kind, self.token, str(getattr(self, "path", ""))],
            stdin=read, stdout=subprocess.DEVNULL, start_new_session=True)
        os.close(read)
        self._keeper_pipe = write  # never inherited (PEP 446): only this process holds it

    def close(self) -> set[int]:
        """Kill every member, remove the container, stop the keeper (idempotent); the pids killed."""
        killed = self.kill_all()
        self._remove()
        if self._keeper is not None:
            os.close(self._keeper_pipe)
            self._keeper.wait()
            self._keeper = None
        return killed

    def _remove(self) -> None:
        return None


class CgroupV2(Containment):
    """A cgroup v2 directory per pool, one child per worker; `cgroup.kill` ends a child's every process."""

    kind = "cgroup2"

    def __init__(self, token: str, path: Path):
        super().__init__(token)
        self.path = path

    def join(self, slot: int) -> dict:
        group = self.path / f"w{slot}"
        group.mkdir()
        return {"cgroup": str(group)}

    def kill(self, slot: int) -> set[int]:
        self.slots.pop(slot, None)
        return _kill_group(self.path / f"w{slot}", self.kind)

    def kill_all(self) -> set[int]:
        self.slots.clear()
        return set().union(*(_kill_group(group, self.kind) for group in _children(self.path)))

    def describe(self) -> str:
        return f"cgroup v2 {self.path}"

    def _remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


class CgroupV1(CgroupV2):
    """The same layout in the cgroup v1 `pids` hierarchy, with `pids.max` on the pool's directory."""

    kind = "cgroup1"

    def describe(self) -> str:
        return f"cgroup v1 {self.path} (pids.max {(self.path / 'pids.max').read_text().strip()})"


def setup_containment(max_tasks: int, kind: str = "auto") -> Containment:
    """The strongest container this machine allows (`kind` "auto"), or the one named; its keeper started."""
    # Random alone: the token is in every worker's environment and cgroup path, and must not tell it the driver's
    # PID (as another user it cannot signal the driver; nor should it learn whom to aim at).
    token = os.urandom(8).hex()
    name = f"aha-rewards-{token}"
    box: Containment | None = None
    if kind in ("auto", "cgroup2"):
        box = _make_group(CgroupV2, token, _own_group("cgroup2", None), name)
    if box is None and kind in ("auto", "cgroup1"):
        box = _make_group(CgroupV1, token, _own_group("cgroup", "pids"), name)
        if box is not None:
            (box.path / "pids.max").write_text(str(max_tasks))
    if box is None and kind in ("auto", "tree"):
        box = Containment(token)
    if box is None:
        raise RuntimeError(f"no {kind} container on this machine (it needs root and a writable /sys/fs/cgroup); "
                           "use kind 'auto'")
    box.keep()
    return box


def _own_group(fstype: str, controller: str | None) -> Path | None:
    """This process's cgroup directory in the hierarchy of `fstype` (with `controller` for v1), if mounted."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    point = next((f[1] for f in map(str.split, mounts) if f[2] == fstype
                  and (controller is None or controller in f[3].split(","))), None)
    if point is None:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or (controller in controllers.split(",")):
            return Path(point) / path.lstrip("/")
    return None


def _make_group(cls: type[CgroupV2], token: str, parent: Path | None, name: str) -> CgroupV2 | None:
    if parent is None:
        return None
    try:
        (parent / name).mkdir()
    except OSError:
        return None
    if cls is CgroupV2 and not (parent / name / "cgroup.kill").exists():  # Linux < 5.14
        (parent / name).rmdir()
        return None
    return cls(token, parent / name)


def _children(path: Path) -> list[Path]:
    with contextlib.suppress(FileNotFoundError):
        return [p for p in path.iterdir() if p.is_dir()]
    return []


def _kill_group(group: Path, kind: str) -> set[int]:
    """Kill every member of `group`, wait until it is empty, remove it; the pids killed."""
    procs = group / "cgroup.procs"
    try:
        seen = {int(p) for p in procs.read_text().split()}
    except FileNotFoundError:
        return set()
    if kind == "cgroup2":
        (group / "cgroup.kill").write_text("1")
    seen |= _kill_until_empty(lambda: {int(p) for p in procs.read_text().split()}, signal_them=kind != "cgroup2")
    # cgroup.procs no longer lists a task that is exiting, but until it has exited the group is busy (EBUSY).
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        try:
            group.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:  # still busy: left behind
                break
            time.sleep(0.01)
    return seen


def _kill_until_empty(find, signal_them: bool = True) -> set[int]:
    """SIGKILL whatever `find()` returns, again and again, until it returns nothing (or KILL_WAIT_S passes); every
    pid it returned."""
    seen: set[int] = set()
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        try:
            pids = find()
        except FileNotFoundError:
            break
        if not pids:
            break
        seen |= pids
        if signal_them:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return seen


def settle(pids: set[int], timeout_s: float = SETTLE_S) -> None:
    """Wait (up to `timeout_s`) until the killed `pids` are reaped: a zombie still counts against its user's
    RLIMIT_NPROC, so a fork right after a fork bomb's kill would fail (EAGAIN) until init has reaped its copies."""
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if os.path.exists(f"/proc/{pid}")}
        if pids:
            time.sleep(0.01)


def members(roots: list[int], marked) -> set[int]:
    """Live processes (no zombies) that descend from one of `roots` (themselves included) or have an environment
    entry for which `marked(entry)` holds."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state in ("Z", "X"):
                continue
            parents[pid] = int(ppid)
            if any(map(marked, Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))):
                found.add(pid)
        except (OSError, ValueError):  # gone, or not ours to read
            continue
    found |= {root for root in roots if root in parents}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    found.discard(os.getpid())
    return found


def _keeper_main(kind: str, token: str, path: str) -> None:
    """Wait for the driver's pipe (stdin) to close, then kill whatever the pool left and remove its cgroup."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while os.read(0, 4096):
        pass
    box: Containment = Containment(token) if kind == "tree" else \
        (CgroupV2 if kind == "cgroup2" else CgroupV1)(token, Path(path))
    box.kill_all()
    box._remove()


if __name__ == "__main__":
    _keeper_main(*sys.argv[1:4])
