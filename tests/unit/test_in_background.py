"""`orchestration.run.in_background`: how a run starts its engines while the learner loads."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestration.run import in_background

ROOT = Path(__file__).resolve().parents[2]


def test_the_result_and_the_exception_reach_whoever_waits():
    assert in_background(lambda a, b: a + b, 2, 3).result(timeout=10) == 5

    def fail() -> None:
        raise ValueError("rollout.backend.max_model_len 10 is below the prompt")

    with pytest.raises(ValueError, match="max_model_len"):
        in_background(fail).result(timeout=10)


def test_a_process_that_fails_meanwhile_does_not_wait_for_it():
    """A resume that cannot see its checkpoint fails while the engines still start: its exit must not wait."""
    code = ("import time; from orchestration.run import in_background; in_background(time.sleep, 600); "
            "raise SystemExit(2)")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
                          timeout=120)
    assert proc.returncode == 2 and time.monotonic() - t0 < 60
