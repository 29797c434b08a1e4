"""MetricsLog sinks: the eval row merges into its step, and Weights & Biases offline files hold the logged keys."""

from __future__ import annotations

import sys

import pytest

from orchestration.config.schema import WandbConfig
from orchestration.metrics import WANDB_SETUP, MetricsLog, open_wandb, read_metrics

TRAIN = {"reward/total": 0.5, "timing/step": 1.0}
EVAL = {"eval/accuracy": 0.25, "eval/accuracy_low": 0.1, "eval/accuracy_high": 0.45, "eval/pass@4": 0.5,
        "eval/pass@4_low": 0.2, "eval/pass@4_high": 0.8, "eval/reward": 0.7}


def test_eval_row_merges_into_its_step_and_a_resumed_step_replaces_both(tmp_path):
    m = MetricsLog(tmp_path, total_steps=3, tensorboard=False, progress="off")
    m.log(1, TRAIN)
    m.log_eval(1, EVAL)
    m.log(2, TRAIN)
    m.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2], "an eval row must not become a step of its own"
    assert rows[0]["eval/accuracy"] == 0.25 and rows[0]["reward/total"] == 0.5 and "merge" not in rows[0]
    m = MetricsLog(tmp_path, total_steps=3, start_step=1, tensorboard=False, progress="off")  # resumed at step 1
    m.log(1, {**TRAIN, "reward/total": 0.9})
    m.close()
    assert "eval/accuracy" not in read_metrics(tmp_path)[0], "a re-run step kept the eval of the run it replaced"


def test_missing_wandb_is_one_line_naming_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an env without the package gives: import raises
    with pytest.raises(RuntimeError, match="wandb package is missing") as err:
        open_wandb(WandbConfig(), tmp_path, {})
    assert WANDB_SETUP in str(err.value) and "\n" not in str(err.value)


def test_wandb_offline_run_files_hold_the_logged_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    m = MetricsLog(tmp_path, total_steps=2, tensorboard=False, progress="off",
                   wandb=WandbConfig(project="aha-test", mode="offline"), run_config={"train": {"steps": 2}})
    m.log(1, TRAIN)
    m.log_eval(1, EVAL)
    m.log(2, TRAIN)
    m.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, f"expected one wandb/offline-run-*/ under the run dir, found {runs}"
    records = b"".join(p.read_bytes() for p in runs[0].glob("*.wandb"))
    for key in ("reward/total", "eval/accuracy", "eval/pass@4", "timing/step"):
        assert key.encode() in records, f"{key} missing from the offline W&B run: the sink dropped it"


def test_tensorboard_tags_keep_pass_at_k_readable(tmp_path):
    m = MetricsLog(tmp_path, total_steps=1, tensorboard=True, progress="off")
    m.log_eval(1, EVAL)
    m.close()
    events = b"".join(p.read_bytes() for p in (tmp_path / "tb").glob("events.*"))
    assert b"eval/pass_at_4" in events and b"eval/accuracy" in events
    assert b"eval/pass@4" not in events and b"eval/pass_4" not in events
