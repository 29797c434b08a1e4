"""A 2-step training run with `rollout.backend.kind: sglang_jax` as the only change to the shipped CPU config.

`python -m orchestration.cli.train` in a subprocess (own Ray cluster, the wrapped SGLang-JAX server behind the rollout
actor, the JAX learner, rewards), on the tiny model. Every step pushes a new adapter version, which SGLang-JAX
merges into its running weights. Assertions read metrics.jsonl, never the log text.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestration.metrics import read_metrics
from rollout.config import RolloutConfig
from conftest import SETUP_HINT
from rollout.sglang_jax_config import default_sglang_python
from test_train_e2e import TINY, serve_and_ask  # the same shrinking to the tiny model; serve's checks

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "countdown_smollm2_cpu.yaml"
# Only the engine changes; the KV cache is shrunk to what the tiny model needs (the shipped 2 GiB also works).
SGLANG = ["rollout.backend.kind=sglang_jax", "rollout.backend.kv_cache_space_gb=0.05"]


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A 2-step run on SGLang-JAX (the run directory)."""
    if not default_sglang_python().exists():
        pytest.fail(f"SGLang-JAX env missing at {default_sglang_python()}: {SETUP_HINT}", pytrace=False)
    try:
        RolloutConfig.model_validate({"backend": {"kind": "sglang_jax"}})
    except ValidationError:
        pytest.fail("rollout.config.BackendConfig does not accept kind sglang_jax: add SglangJaxConfig "
                    "(rollout/sglang_jax_config.py) to the union and its case to rollout.backend.setup_backend",
                    pytrace=False)
    run_dir = tmp_path_factory.mktemp("sglang") / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")} | {"PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "orchestration.cli.train", "--config", str(CONFIG), "--run-dir", str(run_dir), *TINY,
           *SGLANG, "train.steps=2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"training exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return run_dir


def test_two_training_steps_with_sglang_jax(sglang_run):
    rows = read_metrics(sglang_run)
    assert [r["step"] for r in rows] == [1, 2], rows
    assert [r["rollout/adapter_version"] for r in rows] == [1, 2], "each step must push (merge) a new version"
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value), f"step {row['step']}: {key} = {value}"


def test_serve_answers_with_the_adapter_trained_on_sglang_jax(sglang_run):
    """`orchestration.cli.serve` on a run trained with SGLang-JAX serves it through SGLang-JAX (the adapter merged at
    start-up), with the same contract as on vLLM: named adapter, API key, completions and chat."""
    serve_and_ask(sglang_run)
