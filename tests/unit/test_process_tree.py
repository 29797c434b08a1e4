"""A driver that stops its parts inside `ending_what_it_started` leaves none of their processes behind: not even an
orphan that ignores SIGTERM; and it spares what ran before it started.

Real processes: a driver interpreter starts a bystander, then (inside the context) a child, which starts a grandchild
in a session of its own that ignores SIGTERM, waits until it has, and exits (the grandchild is an orphan: Ray's
workers after their raylet, an episode after its host). The driver then exits; what is left is read from /proc the
moment it has.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import MARK, kill_leftovers, marked_processes

ROOT = Path(__file__).resolve().parents[2]
ORPHAN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
CHILD = f"""
import subprocess, sys
orphan = subprocess.Popen([sys.executable, '-c', {ORPHAN!r}], start_new_session=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
assert orphan.stdout.readline().strip() == 'ready'
"""
DRIVER = f"""
import contextlib, subprocess, sys, time
from orchestration.cluster.process_tree import already_running, ending_what_it_started
OWN = {{own}}
# Running before the run starts, so not the run's to end: spared, and still alive when the driver exits.
bystander = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
spare = already_running()
with ending_what_it_started(spare) if OWN else contextlib.nullcontext():
    subprocess.run([sys.executable, '-c', {CHILD!r}], check=True)
print('orphaned', bystander.pid, flush=True)
"""


def run_driver(own: bool) -> tuple[subprocess.CompletedProcess, int, list[int]]:
    """(the driver, its bystander's pid, the marked processes but the bystander alive the moment it exited)."""
    marker = f"tree-{uuid.uuid4().hex}"
    driver = subprocess.run([sys.executable, "-c", DRIVER.format(own=own)], cwd=ROOT, capture_output=True, text=True,
                            env=os.environ | {MARK: marker}, timeout=120)
    left = marked_processes(marker)
    assert driver.returncode == 0, driver.stderr
    bystander = int(driver.stdout.split()[1])
    return driver, bystander, left


def test_an_orphan_that_ignores_sigterm_is_ended_and_a_process_from_before_is_spared():
    driver, bystander, left = run_driver(own=True)
    try:
        assert driver.stdout.split()[0] == "orphaned"
        assert left == [bystander], f"the driver exited and left {left} running (spared: {bystander})"
    finally:
        kill_leftovers(left)


def test_without_it_the_orphan_outlives_the_driver():
    """The case above is a real one: a plain driver leaves the orphan running."""
    driver, bystander, left = run_driver(own=False)
    try:
        assert len(left) == 2 and bystander in left, f"expected the orphan and the bystander alive, found {left}"
    finally:
        kill_leftovers(left)


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
