"""A resume whose learner cannot see the run's checkpoint stops with one line naming the path and the learner's host,
and keeps every row: never a silent restart from step 0.

The run dir is one a 2-step run leaves behind (its config, two metrics and samples rows, the driver's record that
step 2 was saved) whose checkpoints folder the learner cannot see: here it is gone; on a cluster it is on another
host's disk. The learner actor starts for real (local Ray cluster, tiny model); the engine, started beside the
learner's restore, is torn down with the cluster, and the failure does not wait for it to be ready.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.config.files import dump_config, load_config
from orchestration.run_dir import RunDir
from test_train_e2e import TINY as E2E_TINY  # the demo config shrunk to the tiny model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TINY = [*E2E_TINY, "train.steps=3"]


def test_resume_that_cannot_see_the_saved_checkpoint_fails_and_keeps_every_row(tmp_path, tiny_model_dir):
    """Fails on main: there the learner's restore answered (0, {}) without a word, and the driver dropped every
    metrics and samples row and started the run over from step 0."""
    run_dir = RunDir(tmp_path / "run")
    dump_config(load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml", TINY), run_dir.local / "config.yaml")
    for name in ("metrics.jsonl", "samples.jsonl"):
        (run_dir.local / name).write_text("".join(json.dumps({"step": s, "reward/total": 0.0}) + "\n" for s in (1, 2)))
    run_dir.note_saved(2)
    before = {name: (run_dir.local / name).read_bytes() for name in ("metrics.jsonl", "samples.jsonl")}

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli.train", "--resume", str(run_dir.local)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{out}"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("run dir error:")]
    assert len(lines) == 1, out
    assert str(run_dir.local / "checkpoints") in lines[0] and "step 2" in lines[0], lines[0]
    assert socket.gethostname() in lines[0], f"the learner's host is not named: {lines[0]}"
    for name, content in before.items():
        assert (run_dir.local / name).read_bytes() == content, f"{name} changed: rows were dropped or added"
