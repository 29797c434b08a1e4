"""A TPU config started on this CPU box fails in seconds with one line naming what is missing (no TPU here).

Before the check, Ray queued the learner actor forever ("No available node types can fulfill resource request").
The timeout is a guard against that hang, not a timing assertion.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_tpu_config_on_a_cpu_cluster_fails_with_the_resource_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private local cluster, never a shared one
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "orchestration.cli.train", "--config", "configs/countdown_qwen2.5-1.5b_tpu_v5e8.yaml",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("resource error: ")]
    assert lines == ["resource error: learner asks TPU: 4 and the engine TPU: 4; this cluster has TPU: 0; run on a "
                     "TPU VM (its Ray node reports the chips as TPU), or lower learner.resources.tpu and "
                     "rollout.resources.tpu"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
