"""Start a private local Ray cluster whose processes do not share the caller's process group.

`ray.init(address="local")` starts the GCS server, the raylet and Ray's agents as children of this process, in its
process group. A signal sent to that group, as `kill -TERM -PGID`, a batch scheduler cancelling a job or a
supervisor stopping a service sends it, then reaches them together with the run: the GCS and the raylet shut down
at once (Ray blocks only SIGINT in them), and the learner's actor dies under the save the run makes on its way out,
so the run ends with its last finished step unsaved, or saved only when the race goes its way. Started in a group of
their own, they take signals from the run alone, which ends them itself (`ray.shutdown`) once it has saved.

Ray's launcher already does this on Windows (a new process group for each of its processes); on Linux it relies on
kernel fate sharing (PR_SET_PDEATHSIG, set in its `preexec_fn`), which a new group keeps. That ends the GCS server and
the raylet with a SIGKILLed driver, not always what they started (Ray's agents outlived `aha train` and `aha tinker`):
a watcher ends the rest (orchestration/cluster/reaper.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import ray
from ray._private import services  # Ray's process launcher: start_ray_process builds every process with ConsolePopen

from common.pins import require_pinned
from orchestration.cluster.process_tree import already_running, end_descendants
from orchestration.cluster.reaper import watch_driver

log = logging.getLogger(__name__)
STARTUP_TRIES = 3
STARTUP_TIMEOUT = "timed out during startup"  # ray/_private/node.py's message when the raylet is not registered


def start_local_ray(num_cpus: int, log_to_driver: bool = True, configure_logging: bool = True) -> None:
    """A new local cluster (never an existing one: address="local"), its processes in a process group of their own,
    ended with the driver however it ends (orchestration/cluster/reaper.py).

    Ray gives its raylet a fixed 30 s to register with the GCS; on a loaded machine (a 2-core box running a test
    suite's three lanes, or a user's other jobs) it can take longer, and ray.init fails with "The current node timed
    out during startup". The half-started node's processes are then ended and the node started again, up to
    STARTUP_TRIES times in all."""
    watch_driver()
    for attempt in range(1, STARTUP_TRIES + 1):
        spare = already_running()
        try:
            with own_process_group():
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver,
                         configure_logging=configure_logging)
            return
        except Exception as exc:  # Ray raises a bare Exception for this one
            if STARTUP_TIMEOUT not in str(exc) or attempt == STARTUP_TRIES:
                raise
            ray.shutdown()
            end_descendants(spare)
            log.warning("Ray's local node did not register within Ray's 30 s (a loaded machine?); starting it again "
                        "(try %d of %d)", attempt + 1, STARTUP_TRIES)


@contextlib.contextmanager
def own_process_group() -> Iterator[None]:
    """While inside, each process Ray's launcher starts leads a new process group (its children inherit it)."""
    require_pinned("ray", "orchestration/cluster/local_ray.py")
    launcher = services.ConsolePopen

    class OwnGroupPopen(launcher):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnGroupPopen
    try:
        yield
    finally:
        services.ConsolePopen = launcher
