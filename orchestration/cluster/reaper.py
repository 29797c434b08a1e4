"""Nothing a run started outlives it: a watcher that ends a private cluster's processes when its driver dies.

A private cluster's GCS server and raylet share the driver's fate (Ray's launcher sets PR_SET_PDEATHSIG), but not
everything below them follows: `aha tinker` SIGKILLed left Ray's dashboard and runtime-env agents running
(tests/integration/test_quick_e2e.py, before this watcher), and a process whose parent dies uncleanly (an engine
under a Ray worker, a reward worker) is orphaned rather than ended. A SIGKILL is what the OOM killer, a scheduler's
hard stop and a test's timeout send, and no handler in the driver runs for it.

So before Ray starts, the driver tags its environment with a cluster id (`TAG`): every process of the cluster inherits
it (Ray's daemons and workers, the engines and reward workers they start). It also starts this watcher, outside its
process group and without the tag. The watcher waits for the driver to exit, however it exits (a pidfd: no pid reuse
race), then SIGKILLs every process still carrying the tag, and exits. After a clean exit it finds nothing.

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


def reap(cluster_id: str) -> int:
    """SIGKILL every process of the cluster; how many were still there."""
    pids = [pid for pid in processes_with(TAG, cluster_id) if pid != os.getpid()]
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
    if fd is not None:
        select.select([fd], [], [])  # readable once the driver has exited
    # Again until none is left: a process may have been forking while the first pass looked.
    for _ in range(20):
        if reap(cluster_id) == 0:
            break
        time.sleep(0.25)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
