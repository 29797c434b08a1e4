"""The benchmarks still run: each learner-side bench at tiny sizes, its printed figures parsed.

No timing is asserted (speed lives in the benches' own one-run ratios); what fails here is a bench that rotted
against the code it measures, as bench_scaleout once did (its toy batch predated a TrainBatch field). The engine
benches (bench_rollout, bench_loop, bench_sglang_jax) need their own servers and stay out of the suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TINY_BATCH = ["--model", "tiny-llama", "--samples", "4", "--prompt-len", "8", "--completion-len", "8"]


def _run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, f"bench/{script}", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, f"bench/{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"no {pattern!r} in:\n{text}"
    return float(match.group(1))


def test_bench_learner_prints_its_ratios():
    out = _run("bench_learner.py", *TINY_BATCH, "--prompts", "2", "--micro-batch", "4", "--steps", "1",
               "--tunix", "--vs", "share_prompts=false")
    assert _number(r"step_s: ([\d.]+)", out) > 0
    assert _number(r"mfu_cpu = ([\d.]+)", out) > 0
    assert _number(r"ratio share_prompts=false / ours = ([\d.]+)", out) > 0
    assert _number(r"ratio ours/tunix = ([\d.]+)", out) > 0


@pytest.mark.parametrize("what", ["ours", "decoder"])
def test_trace_learner_attributes_op_time(what):
    out = _run("trace_learner.py", *TINY_BATCH, "--what", what, "--top", "5")
    rows = re.findall(r"^\s*([\d.]+) ms  ", out, re.M)
    assert rows and sum(map(float, rows)) > 0, out


def test_bench_rewards_scores_every_reward():
    out = _run("bench_rewards.py", "--n", "300").replace(",", "")
    for name in ("countdown", "format", "repetition", "math_answer"):
        assert _number(rf"(?m)^{name}\s+(\d+) scores/s", out) > 0
    assert "errors 0" in out, out


def test_environment_host_cost_prints_its_figures():
    out = _run("environment_host_cost.py", "--episodes", "4", "--turns", "2", "--rounds", "2")
    assert _number(r"hosted: .* \(([\d.]+) ms an episode\)", out) > 0
    assert _number(r"each episode's process ([\d.]+) MiB", out) > 0
