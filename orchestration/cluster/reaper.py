"""Nothing a run started outlives it: a watcher that ends a private cluster's processes when its driver dies.

A private cluster's GCS server and raylet share the driver's fate (Ray's launcher sets PR_SET_PDEATHSIG), but not
everything below them follows: `aha tinker` SIGKILLed left Ray's dashboard and runtime-env agents running
(tests/integration/test_quick_e2e.py, before this watcher), and a process whose parent dies uncleanly (an engine
under a Ray worker, a reward worker) is orphaned rather than ended. A SIGKILL is what the OOM killer, a scheduler's
hard stop and a test's timeout send, and no handler in the driver runs for it.

So the driver starts this watcher, outside its process group, before Ray starts. While the driver lives the watcher
notes its descendants once a second (pid and start time: a pid reused later is not taken for one of them); the
moment the driver exits, however it exits (a pidfd: no pid reuse race), it SIGKILLs every one still alive, and every
process carrying the cluster id (`TAG`) the driver put in its environment for the cluster to inherit (what was born
after the last look: Ray's workers, the engines and reward workers they start). After a clean exit it finds nothing.
Both, because neither alone is enough: Ray's dashboard and runtime-env agents do not inherit the tag (their raylet
starts them with an environment of its own), and a process orphaned before the last look is no descendant any more.

    python -m orchestration.cluster.reaper DRIVER_PID CLUSTER_ID
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

TAG = "AHA_CLUSTER_ID"
LOOK_S = 1.0
"""How often the watcher notes the driver's descendants (a /proc scan: milliseconds)."""


def processes_with(variable: str, value: str) -> list[int]:
    """Pids of live processes whose environment (as they were started) has variable=value."""
    needle = f"{variable}={value}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # exited, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(pid))
    return found


def process_table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time in clock ticks)} of every live process."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        table[int(pid)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(root: int, table: dict[int, tuple[int, int]]) -> dict[int, int]:
    """{pid: start time} of every process below `root` in `table`."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return found


def reap(cluster_id: str, known: dict[int, int]) -> int:
    """SIGKILL the processes in `known` (pid: start time) still alive as themselves, and every process carrying the
    cluster's tag; how many there were."""
    table = process_table()
    pids = {pid for pid, start in known.items() if table.get(pid, (0, None))[1] == start}
    pids |= set(processes_with(TAG, cluster_id))
    pids.discard(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def watch_driver() -> None:
    """Tag this process's environment with a new cluster id and start the watcher for it; call before `ray.init`
    starts a private cluster (its processes inherit the tag)."""
    cluster_id = uuid.uuid4().hex
    os.environ[TAG] = cluster_id
    env = {k: v for k, v in os.environ.items() if k != TAG}
    # A session of its own: a signal to the driver's process group (Ctrl-C, a scheduler's cancel) leaves the watcher
    # to do its job once the driver has gone.
    subprocess.Popen([sys.executable, "-m", "orchestration.cluster.reaper", str(os.getpid()), cluster_id], env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)


def main(argv: list[str]) -> int:
    driver, cluster_id = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fd = os.pidfd_open(driver)
    except ProcessLookupError:  # the driver is gone already
        fd = None
    known: dict[int, int] = {}
    # Readable once the driver has exited; until then, a look at its descendants each LOOK_S.
    while fd is not None and not select.select([fd], [], [], LOOK_S)[0]:
        known = descendants(driver, process_table())
    # Again until none is left: a process may have been forking while the first pass looked.
    for _ in range(20):
        if reap(cluster_id, known) == 0:
            break
        time.sleep(0.25)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
