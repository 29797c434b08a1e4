"""Scale-out end to end: `python -m orchestration.train` with rollout.replicas=2 (two vLLM servers, each behind its
own RolloutServer actor) and learner.hosts=2 (two JAX processes joined by jax.distributed), on the tiny model.

One engine replica is killed between steps 1 and 2 by the fault hook (`AHA_FAULT=between:kill_engine@1`, replica 0's
server): the run must still finish every step, record the restart, and keep the other replica serving. Assertions
read metrics.jsonl, never the log text.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile

import pytest

from orchestration.metrics import read_metrics
from rollout.config import RolloutConfig, VllmConfig
from rollout.fleet import RolloutFleet
from rollout.peft_layout import random_peft_adapter
from rollout.sampling import SamplingParams
from test_train_e2e import CONFIG, ROOT, TINY, assert_finite_rows, clean_env, train_cmd

pytestmark = pytest.mark.integration
SCALE = [*TINY, "rollout.replicas=2", "learner.hosts=2", "rollout.backend.kv_cache_space_gb=1"]


def test_two_replicas_two_learner_processes_survive_a_killed_replica(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    env = clean_env() | {"AHA_FAULT": "between:kill_engine@1"}  # one replica only; the other keeps serving
    proc = subprocess.run(train_cmd("--config", str(CONFIG), "--run-dir", str(run_dir), *SCALE, "train.steps=3"),
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    out = proc.stdout
    assert proc.returncode == 0, f"run did not survive a killed replica:\n{out[-4000:]}"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3], "a step was lost to the replica restart"
    assert sum(r["rollout/restarts"] for r in rows) >= 1, "the replica restart was not recorded in metrics"
    assert [r["rollout/adapter_version"] for r in rows] == [1, 2, 3]
    assert_finite_rows(rows)
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists(), "process 0 did not export the adapter"


def test_fleet_spreads_groups_and_pushes_every_version_to_all(tiny_model_dir):
    """Two real vLLM replicas: groups land on both, each group's n samples on one, every sample made by the pushed
    version; a replica whose engine is killed between steps misses no version: it is rebuilt with the current one
    while the other serves."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, max_lora_rank=8, kv_cache_space_gb=1), replicas=2,
                        resources={"num_cpus": 0})
    params = SamplingParams(n=3, max_tokens=4, temperature=1.0, ignore_eos=True)
    prompts = [[1, 2, 3 + i] for i in range(6)]
    try:
        with RolloutFleet(cfg, tiny_model_dir) as fleet:
            fleet.push_lora(1, *random_peft_adapter(tiny_model_dir, 8, seed=1, scale=0.02))
            groups = fleet.generate(prompts, params)
            assert [len(g) for g in groups] == [3] * 6
            assert {c.adapter_version for g in groups for c in g} == {1}
            metrics = fleet.metrics()
            counts = [metrics[f"rollout/replica{i}/requests"] for i in (0, 1)]
            assert counts == [3.0, 3.0], f"6 groups at once should split 3/3 by least outstanding, got {counts}"

            victim = ray.get(fleet.replicas[1].rollout.actor.pid.remote())
            os.killpg(victim, signal.SIGKILL)
            fleet.push_lora(2, *random_peft_adapter(tiny_model_dir, 8, seed=2, scale=0.02))
            groups = fleet.generate(prompts, params)
            assert {c.adapter_version for g in groups for c in g} == {2}, "a replica served a stale adapter"
            assert fleet.events, "the dead replica's restart was not recorded"
            assert sum(fleet.metrics()[f"rollout/replica{i}/restarts"] for i in (0, 1)) >= 1
    finally:
        ray.shutdown()
