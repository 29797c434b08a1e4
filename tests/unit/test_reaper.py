"""orchestration/cluster/reaper.py: what a SIGKILLed driver started dies with it, whether or not it inherited the
cluster's tag. Real processes: a stand-in driver (a Python process) starts a child that keeps the tag and a grandchild
started with an environment of its own (as Ray's raylet starts its agents), then is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestration.cluster.reaper import TAG, descendants, process_table

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import os, subprocess, sys, time
from orchestration.cluster.reaper import watch_driver
watch_driver()
tagged = subprocess.Popen(["sleep", "300"])
untagged = subprocess.Popen([sys.executable, "-c",
    "import subprocess, time; subprocess.Popen(['sleep', '301'], env={'PATH': '/usr/bin:/bin'}); time.sleep(300)"],
    env={"PATH": "/usr/bin:/bin"})
print(tagged.pid, untagged.pid, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_sigkilled_drivers_descendants_die_tagged_or_not():
    """Fails without the descendants' snapshot: the grandchild started with an environment of its own (no tag)
    outlived the driver, as Ray's agents outlived `aha train` (reaper.py's docstring)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    tagged, untagged = map(int, driver.stdout.readline().split())
    deadline = time.monotonic() + 30
    while len(below := descendants(driver.pid, process_table())) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)  # the watcher, the two children, the grandchild
    time.sleep(2.5)  # the watcher's look at the descendants (LOOK_S) has seen the grandchild
    grandchild = next(pid for pid in below if process_table().get(pid, (0, 0))[0] == untagged)
    assert TAG.encode() not in Path(f"/proc/{grandchild}/environ").read_bytes()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 10
    while any(map(alive, (tagged, untagged, grandchild))) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in (tagged, untagged, grandchild) if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still alive 10 s after the driver's SIGKILL: {left} (tagged {tagged}, untagged {untagged}, " \
                     f"its child {grandchild})"
