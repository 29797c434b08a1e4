"""A part pinned to its cores keeps every thread there: a real `aha train` run (tiny model) with the engine on one
core (`rollout.backend.cpu_cores`) and the learner on another (`learner.cpu_cores`), read from /proc while it trains.

Fails before the fix (learner/actor.py pinned only the thread that builds the learner, with
`os.sched_setaffinity(0, ...)`): the threads the actor's process had already started (Ray's own, and whatever they
start later) stayed allowed on every core, 23 of the learner's 32 threads in a pinned demo run (issue 37), so the
learner's work could land on the engine's core. Now common/affinity.py `pin_process` moves every thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from common.affinity import allowed_cores
from conftest import MARK, marked_processes
from orchestration.metrics import read_metrics
from test_train_e2e import CONFIG, ROOT, TINY, clean_env, train_cmd

pytestmark = pytest.mark.integration

ROLE_OF = {"LearnerWorker": "learner", "engine_launcher": "engine"}
"""A /proc/PID/cmdline fragment -> the part whose process tree it heads (Ray titles an actor's process
`ray::LearnerWorker...`; the engine's launcher heads the engine's server, engine core and worker)."""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def parts_of(pids: list[int]) -> dict[int, str]:
    """Each marked process that belongs to a pinned part, with the part: its own title, or an ancestor's."""
    heads = {pid: role for pid in pids for key, role in ROLE_OF.items() if key in cmdline(pid)}
    out = {}
    for pid in pids:
        p = pid
        while p > 1 and p not in heads:
            p = parent(p)
        if p in heads:
            out[pid] = heads[p]
    return out


def test_every_thread_of_a_pinned_engine_and_learner_stays_on_its_cores(tmp_path, tiny_model_dir):
    cores = sorted(os.sched_getaffinity(0))
    assert len(cores) >= 2, f"this test pins the engine and the learner to different cores; it has {cores}"
    want = {"engine": {cores[0]}, "learner": {cores[1]}}
    mark = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        train_cmd("--config", str(CONFIG), "--run-dir", str(run_dir), *TINY, "train.steps=50", "train.save_every=0",
                  "logging.plots=false", f"rollout.backend.cpu_cores=[{cores[0]}]", f"learner.cpu_cores=[{cores[1]}]"),
        cwd=ROOT, env={**clean_env(), MARK: mark}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # Two finished steps: the engine has generated and loaded an adapter, the learner has run its update; the
        # threads they start are started. Read while the run goes on.
        while (proc.poll() is None and not (run_dir / "metrics.jsonl").exists()) or \
                (proc.poll() is None and len(read_metrics(run_dir)) < 2):
            time.sleep(0.5)
        assert proc.poll() is None, f"the run ended before its second step:\n{proc.stderr.read()[-3000:]}"
        pids = marked_processes(mark)
        roles = parts_of(pids)
        threads = {pid: allowed_cores(pid) for pid in roles}
        names = {tid: thread_name(pid, tid) for pid in roles for tid in threads[pid]}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert {"engine", "learner"} <= set(roles.values()), f"found {sorted(set(roles.values()))} of engine and learner " \
        f"among the run's processes: {[cmdline(p)[:80] for p in pids]}"
    for role in ("engine", "learner"):
        tids = [(pid, tid, allowed) for pid, per in threads.items() if roles[pid] == role for tid, allowed in per.items()]
        astray = [f"{names[tid]} ({pid}/{tid}) on {sorted(allowed)}" for pid, tid, allowed in tids
                  if allowed != want[role]]
        assert tids and not astray, f"{len(astray)} of the {role}'s {len(tids)} threads are not pinned to " \
            f"{sorted(want[role])}: {astray[:8]}"
