"""In-loop eval and the eval CLI for real, on the tiny model: `python -m orchestration.cli.train` with eval.every=1
(the training engine scores held-out prompts with the adapter just pushed), then `python -m orchestration.cli.eval` on
that run (base vs the run's adapter, one engine). Assertions read metrics.jsonl and eval.json, never the log text.
A random tiny model solves nothing, so the checks are about the machinery: keys, interval bounds, shapes.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import MARK, assert_nothing_outlives, marked_processes
from orchestration.metrics import read_metrics
from test_train_e2e import TINY  # the shipped demo config shrunk to the tiny model; eval.every below turns eval on

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "countdown_smollm2_cpu.yaml"


def run(module: str, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{module} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def assert_interval(row: dict, key: str) -> None:
    value, low, high = row[key], row[f"{key}_low"], row[f"{key}_high"]
    assert 0.0 <= low <= value <= high <= 1.0 and math.isfinite(value), f"{key}: {low} <= {value} <= {high} fails"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir) -> Path:
    run_dir = tmp_path_factory.mktemp("inloop") / "run"
    run("orchestration.cli.train", "--config", str(CONFIG), "--run-dir", str(run_dir), *TINY, "train.steps=2",
        "eval.every=1", "eval.prompts=6", "eval.k=2", "eval.max_tokens=16")
    return run_dir


def test_every_step_logs_held_out_eval(run_dir):
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2], "eval rows must merge into their step, not add steps"
    for row in rows:
        assert "reward/total" in row, "the eval row replaced the step's train row"
        for key in ("eval/accuracy", "eval/pass@2"):
            assert_interval(row, key)
        assert math.isfinite(row["eval/reward"]) and 0 < row["eval/completion_len_mean"] <= 16
        assert row["timing/eval"] > 0
    assert (run_dir / "plots" / "reward.png").stat().st_size > 10_000


def test_eval_cli_on_the_run_reports_intervals_and_the_difference(run_dir):
    # Options and overrides intermixed, as users type them.
    run("orchestration.cli.eval", str(run_dir), "--limit", "8", "rollout.sampling.max_tokens=16", "--k", "2",
        "--progress", "off")
    report = json.loads((run_dir / "eval.json").read_text())
    assert (report["prompts"], report["k"]) == (8, 2)
    for phase in ("base", "trained"):
        acc = report[phase]["accuracy"]
        assert acc["n"] == 16 and 0 <= acc["low"] <= acc["value"] <= acc["high"] <= 1, (phase, acc)
        assert report[phase]["pass@2"]["n"] == 8
    diff = report["difference"]["accuracy"]
    assert diff["low"] <= diff["value"] <= diff["high"] and diff["n"] == 8
    assert diff["value"] == pytest.approx(report["trained"]["accuracy"]["value"] - report["base"]["accuracy"]["value"])
    assert (run_dir / "eval.png").stat().st_size > 10_000


def eval_until_generating(run_dir: Path, out: str, **popen) -> tuple[subprocess.Popen, bytes, str]:
    """`aha eval` on the run (its processes marked), returned once its engine generates (the progress bar on stderr):
    (the process, its stderr so far, the mark)."""
    marker = f"eval-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")} | {MARK: marker}
    proc = subprocess.Popen([sys.executable, "-m", "orchestration.cli.eval", str(run_dir), "--limit", "6", "--k", "2",
                             "--progress", "on", "--out", str(run_dir / out)], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, **popen)
    err = b""
    deadline = time.monotonic() + 600
    while b"base:" not in err and time.monotonic() < deadline:
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            break
        err += chunk
    if b"base:" not in err:
        proc.kill()
        raise AssertionError(f"eval never started generating:\n{err.decode()[-3000:]}")
    return proc, err, marker


def test_eval_stopped_by_sigterm_says_so_in_one_line_and_leaves_no_engine(run_dir):
    """SIGTERM while eval generates: one line, exit 143, the engine shut down.

    Started as a script's background job starts it (SIGINT and SIGTERM inherited as ignored). Before eval
    re-installed its handlers after `ray.init`, Ray's own C++ SIGTERM handler took the signal
    (`logging.cc: *** SIGTERM received ***`, then `Aborted`).
    """

    def ignore_interrupts() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    proc, err, marker = eval_until_generating(run_dir, "eval-stopped", stdout=subprocess.PIPE,
                                              preexec_fn=ignore_interrupts)
    try:
        proc.send_signal(signal.SIGTERM)
        out, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (err + rest).decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, f"eval exited {proc.returncode}:\n{text[-3000:]}"
    last = text.strip().splitlines()[-1]
    assert "eval stopped" in last and "(interrupted by SIGTERM)" in last, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert not (run_dir / "eval-stopped" / "eval.json").exists()
    assert marked_processes(marker) == [], "eval left its engine running after SIGTERM"


def test_eval_sigkilled_while_generating_leaves_nothing_running(run_dir):
    """SIGKILL (no handler runs) while eval's engine generates: its Ray cluster and engine end with it, within
    conftest's SIGKILL_CLEANUP_S (orchestration/cluster/reaper.py; fails on main at 98997ee only when Ray's own
    fate sharing is slow, as it was for `aha tinker`: test_quick_e2e.py)."""
    proc, _, marker = eval_until_generating(run_dir, "eval-killed", stdout=subprocess.DEVNULL,
                                            start_new_session=True)
    try:
        proc.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_nothing_outlives(marker, "aha eval")


def test_the_same_eval_twice_gives_the_same_samples_and_figures(run_dir):
    """`aha eval` twice on one run (base and adapter, 40 prompts x 4 at temperature 2: three batches): every
    sample's text and every figure of eval.json the same; only the wall time may differ.

    Fails before the eval seeded its requests and had the engine run each batch whole (orchestration/evaluation.py):
    its samples were unseeded draws, another set in every run (the demo's base accuracy read 0.021, 0.028, 0.029
    and 0.034 on the same 200 puzzles), and even seeded, a request's engine steps depended on when the requests
    arrived (docs/benchmarks.md, "Evals reproduce"). Temperature 2, not the run's 0.7, at which tiny-llama answers
    "\\n" every time (test_train_e2e.VARIED says why), so every sample of main at fe1415a's check was "" whatever
    its seed: the samples now differ across prompts and seeds (asserted), so equal samples say the seeds held.
    """
    reports, outs = [], []
    for name in ("first", "second"):
        out = run_dir / f"eval-{name}"
        run("orchestration.cli.eval", str(run_dir), "--limit", "40", "--k", "4", "--max-tokens", "16",
            "--temperature", "2", "--progress", "off", "--out", str(out))
        report = json.loads((out / "eval.json").read_text())
        report.pop("seconds")
        report["command"] = report["command"].replace(str(out), "OUT")
        reports.append(report)
        outs.append(out)
    assert reports[0] == reports[1], "the same eval's figures (or its first samples) differ between two runs"
    assert reports[0]["schedule"] == {"seeded": True, "prompts_per_batch": 16, "whole_batches": True}
    first, second = ([json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
                     for out in outs)
    assert len(first) == 2 * 40 * 4, "eval_samples.jsonl holds every sample of both phases"
    assert_samples_vary([s for s in first if s["phase"] == "base"])
    differ = [(a["phase"], a["prompt"], a["sample"]) for a, b in zip(first, second) if a != b]
    assert not differ, f"{len(differ)} of {len(first)} samples differ between two runs, e.g. {differ[:5]}"


def assert_samples_vary(samples: list[dict]) -> None:
    """One phase's samples differ across prompts and across the k seeds of a prompt, and most are several words:
    two evals that drew them alike drew them with the same seeds. Fails at the run's temperature 0.7 (main at
    fe1415a's check): all 160 texts "" (one "\\n" token, cut by the stop string)."""
    texts = [s["text"] for s in samples]
    assert len(set(texts)) >= len(texts) // 2, f"{len(set(texts))} distinct texts of {len(texts)}"
    assert sum(len(t) >= 16 for t in texts) >= len(texts) // 2, f"most texts are short: {texts[:8]}"
    by_prompt: dict[int, set[str]] = {}
    for s in samples:
        by_prompt.setdefault(s["prompt"], set()).add(s["text"])
    assert all(len(seen) >= 2 for seen in by_prompt.values()), "a prompt's k seeds drew one text"
