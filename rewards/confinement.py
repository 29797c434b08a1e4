"""What a reward worker does to itself before it runs any user code (rewards/worker.py calls `confine` first).

In order, each step needing what the one before still has:
1. join the pool's container (rewards/containment.py): its cgroup, or become a child subreaper;
2. cap its resources, soft = hard so that no call can raise them again: RLIMIT_DATA (memory), RLIMIT_NPROC (a fork
   bomb gets EAGAIN; the count is per user, so it is the tasks the user runs already plus the pool's allowance),
   RLIMIT_FSIZE (a file it writes), RLIMIT_NOFILE (open files);
3. leave the host's network, unless `rewards.pool.network` says otherwise: a network namespace of its own, empty
   (its loopback down, no other interface), so a reward can neither call out nor reach the run's engines, the
   driver's ports or any local service; as root by unshare(CLONE_NEWNET), otherwise inside a user namespace of
   its own that maps its user to itself (the kernel's rule for an unprivileged unshare);
4. when started as root, become the unprivileged `rewards.pool.user`: root may raise any limit, signal the driver
   and write the run directory; that user may do none of it. The driver's code often lies where that user cannot
   reach (a virtual environment under /root, mode 0700): each `sys.path` folder it cannot read is opened before
   the switch and imported from through /proc/self/fd/N, which reaches the folder without its parents. Files a
   reward reads by its own path must be readable by that user;
5. die with the driver: PR_SET_PDEATHSIG, set after the switch (a change of user clears it).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000


def confine(init: dict, parent: int) -> None:
    """Steps 1-5 above; `parent` is the pid this process had as its parent when it started."""
    join(init["join"])
    for name, value in init["limits"].items():
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY and os.geteuid() != 0:  # only root may raise a hard limit
            value = min(value, hard)
        resource.setrlimit(which, (value, value))
    if not init["network"]:
        leave_network()
    if init["user"] is not None:
        sys.path[:] = become(*init["user"], sys.path)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the driver died before the death signal was armed
        os._exit(1)


def join(how: dict) -> None:
    if "cgroup" in how:
        Path(how["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
    if how.get("subreaper"):
        _prctl(PR_SET_CHILD_SUBREAPER, 1)


def leave_network() -> None:
    """Move this process into a new, empty network namespace (step 3). Raises OSError with the one line to act on
    when the kernel refuses (no CAP_SYS_ADMIN and no unprivileged user namespaces)."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"a reward worker cannot leave the host's network (unshare: {os.strerror(err)}); run as "
                           "root, allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1), or "
                           "set rewards.pool.network: true to give the rewards the host's network")
    if flags & CLONE_NEWUSER:  # the same ids inside as outside, so files and limits see the same user
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def become(uid: int, gid: int, paths: list[str]) -> list[str]:
    """Switch to `uid`/`gid` for good (real, effective and saved) and return `paths` as that user can import them."""
    held = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in dict.fromkeys(paths) if p and os.path.isdir(p)}
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    # A change of user makes the process undumpable, which hands /proc/self/fd to root; this user needs it back.
    _prctl(PR_SET_DUMPABLE, 1)
    for path, fd in list(held.items()):
        if os.access(path, os.R_OK | os.X_OK):  # reachable by its own path: keep that one
            os.close(fd)
            del held[path]
    via = {path: f"/proc/self/fd/{fd}" for path, fd in sorted(held.items(), key=lambda kv: -len(kv[0]))}
    # Packages imported already (the stdlib's, pydantic's) find their submodules through __path__, not sys.path.
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [_through(entry, via) for entry in search]
    sys.path_importer_cache.clear()
    return [_through(path, via) for path in paths]


def _through(path: str, via: dict[str, str]) -> str:
    """`path`, reached through the held folder that contains it, if one does."""
    for folder, fd_path in via.items():
        if path == folder or path.startswith(folder + os.sep):
            return fd_path + path[len(folder):]
    return path


def task_count(uid: int) -> int:
    """Tasks (processes and threads) user `uid` runs now: what RLIMIT_NPROC counts."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(line.split(":\t", 1) for line in Path(entry.path, "status").read_text().splitlines()
                          if line.startswith(("Uid:", "Threads:")))
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return total


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")
