"""A driver that owns its descendants leaves none behind: not even an orphan that ignores SIGTERM.

Real processes: a driver interpreter starts a child, which starts a grandchild in a session of its own that ignores
SIGTERM, waits until it has, and exits (the grandchild is an orphan: Ray's workers after their raylet, a reward's
daemon after its worker). The driver then exits; what is left is read from /proc the moment it has.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import MARK, marked_processes

ROOT = Path(__file__).resolve().parents[2]
ORPHAN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
CHILD = f"""
import subprocess, sys
orphan = subprocess.Popen([sys.executable, '-c', {ORPHAN!r}], start_new_session=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
assert orphan.stdout.readline().strip() == 'ready'
"""
DRIVER = f"""
import subprocess, sys
OWN = {{own}}
if OWN:
    from orchestration.cluster.process_tree import own_descendants_until_exit
    own_descendants_until_exit()
subprocess.run([sys.executable, '-c', {CHILD!r}], check=True)
print('orphaned', flush=True)
"""


def run_driver(own: bool) -> tuple[subprocess.CompletedProcess, list[int]]:
    marker = f"tree-{uuid.uuid4().hex}"
    driver = subprocess.run([sys.executable, "-c", DRIVER.format(own=own)], cwd=ROOT, capture_output=True, text=True,
                            env=os.environ | {MARK: marker}, timeout=120)
    return driver, marked_processes(marker)


def test_an_orphan_that_ignores_sigterm_ends_with_the_driver():
    driver, left = run_driver(own=True)
    assert driver.returncode == 0 and driver.stdout.split() == ["orphaned"], driver.stderr
    assert left == [], f"the driver exited and left {left} running"


def test_without_it_the_orphan_outlives_the_driver():
    """The case above is a real one: a plain driver leaves the orphan running."""
    driver, left = run_driver(own=False)
    try:
        assert driver.returncode == 0, driver.stderr
        assert len(left) == 1, f"expected the orphan alive after a plain driver exited, found {left}"
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)


def test_descendants_are_children_and_their_children():
    from orchestration.cluster.process_tree import descendants

    keeper = ("import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; "
              "time.sleep(600)']); print(g.pid, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", keeper], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert {child.pid, grandchild} <= set(descendants())
        assert descendants(child.pid) == [grandchild]
        assert os.getpid() not in descendants() and grandchild not in descendants(grandchild)
    finally:
        for pid in (grandchild, child.pid):
            os.kill(pid, signal.SIGKILL)
        child.wait()
