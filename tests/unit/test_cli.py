"""The `aha` console script reaches every entry point (prepare-model in the engine env, where torch is)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def aha(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_aha_help_lists_every_command():
    proc = aha("--help")
    assert proc.returncode == 0, proc.stderr
    assert all(f"  {name} " in proc.stdout for name in ("train", "serve", "eval", "preflight", "prepare-model", "tpu-check"))
    unknown = aha("bogus")
    assert unknown.returncode == 2 and "unknown command 'bogus'" in unknown.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_runs_its_entry_point(command):
    proc = aha(command, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:300]
