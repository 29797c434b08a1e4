"""Multi-turn failure paths in a real training run: `python -m orchestration.cli.train` (the demo config on the tiny
model, test_train_e2e's TINY overrides, 2 steps) with an environment from tests/integration/hostile_environments.py
whose five rows fail five ways: one answers, one raises, one sleeps with SIGTERM ignored, one loops in C holding the
GIL, one awaits forever. Every step draws all five rows (4 episodes each).

Assertions read metrics.jsonl and samples.jsonl, and /proc for what the run left (every process the run started
inherits its AHA_TEST_MARK).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import MARK, command_lines, marked_processes
from orchestration.metrics import read_metrics
from test_train_e2e import TINY, clean_env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "countdown_smollm2_cpu.yaml"
MODES = ("ok", "raises", "sleeps", "holds_gil", "awaits_forever")
N = 4  # TINY's rollout.sampling.n
STEP_TIMEOUT_S = 2
HOSTILE = [*TINY, "environment.name=tests.integration.hostile_environments:Hostile", "environment.max_turns=2",
           "environment.max_episode_tokens=64", f"environment.step_timeout_s={STEP_TIMEOUT_S}",
           f"train.prompts_per_step={len(MODES)}", "train.steps=2"]


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, tiny_model_dir) -> tuple[Path, subprocess.CompletedProcess, dict[int, str]]:
    """The run, its process, and what it left behind (pid: command line, read the moment it exited)."""
    run_dir = tmp_path_factory.mktemp("hostile") / "run"
    marker = f"hostile-{uuid.uuid4().hex}"
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli.train", "--config", str(CONFIG), "--run-dir",
                           str(run_dir), *HOSTILE], cwd=ROOT, env=clean_env() | {MARK: marker},
                          capture_output=True, text=True, timeout=900)
    return run_dir, proc, command_lines(marked_processes(marker))


def test_each_failure_ends_its_episode_and_is_counted_while_the_run_finishes(hostile_run):
    """Fails on main at c3b0474: there a plain step ran on a thread of the driver, and the one looping in C held the
    GIL and froze the driver: step 1 never finished and the run hit the fixture's timeout (checked with it at 300 s:
    `1 error in 301.26s`, train.log silent after step 1's first episode errors)."""
    run_dir, proc, _ = hostile_run
    assert proc.returncode == 0, f"training exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    episodes = len(MODES) * N
    for row in rows:
        # ok: done; raises: error; sleeps, holds_gil, awaits_forever: timeout.
        assert row["env/errors"] == 4 * N, row
        assert row["env/end_error"] == pytest.approx(N / episodes), row
        assert row["env/end_timeout"] == pytest.approx(3 * N / episodes), row
        assert row["env/end_done"] == pytest.approx(N / episodes), row
        assert row["env/ok_steps_mean"] == pytest.approx(N / episodes), "the answering episodes were not played"
    ends = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        logged = json.loads(line)
        mode = next(m for m in MODES if f"({m})" in logged["prompt"])
        ends.setdefault(mode, set()).update(e["end"] for e in logged["episodes"])
    expected = {"ok": {"done"}, "raises": {"error"}, "sleeps": {"timeout"}, "holds_gil": {"timeout"},
                "awaits_forever": {"timeout"}}
    assert all(ends[mode] == expected[mode] for mode in ends), ends
    log = (run_dir / "train.log").read_text()
    assert "step raised ValueError('hostile step')" in log
    assert f"took longer than environment.step_timeout_s ({STEP_TIMEOUT_S} s)" in log


def test_the_run_leaves_no_process_behind(hostile_run):
    """Nothing the run started outlives it: not the environment's host, not an episode's process (the ones killed
    mid-step included), not Ray or the engine. Fails on main at c3b0474 (the run never ended; see above)."""
    _, proc, left = hostile_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert left == {}, f"processes of the run alive after it exited: {left}"
