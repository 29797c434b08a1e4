"""A learner on 2 JAX processes (2 fake CPU devices each, joined by jax.distributed under real Ray actors) does
the same GRPO step as one process with 4 devices: loss, grad norm and the updated LoRA agree within 1e-5.

Both run the real Learner on the tiny model; only the number of processes differs. The batch has two
mini-batches (two optimizer updates, the off-policy path with its gathered old logprobs) and two steps are taken,
so the LoRA A matrices (zero gradient while B = 0) move too. The multi-process checkpoint (Orbax, every process
writes its part) is saved and restored by the group.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import ray

from learner.config import LearnerConfig
from learner.group import LearnerGroup, start_learner
from learner.handle import LearnerHandle
from learner.learner import Learner
from orchestration.update import grpo_step
from test_learner_checkpoint import toy_batch

pytestmark = pytest.mark.integration
CFG = {"optimizer": {"lr": 1e-2}, "seq_bucket": 16, "grpo": {"micro_batch_size": 4, "mini_batch_size": 4}}
TOL = 1e-5
STOP_BOUND_S = 180  # a run that lost a learner process must exit within this beyond its own steps' time
ROOT = Path(__file__).resolve().parents[2]


def fake_devices(n: int) -> dict:
    """Each process's Ray options: no CPU reserved (two share the cores), n fake devices."""
    return {"num_cpus": 0, "runtime_env": {"env_vars": {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}", "JAX_PLATFORMS": "cpu"}}}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_mh_"),
             log_to_driver=False)
    yield
    ray.shutdown()


def test_two_processes_match_one_process(local_ray, tiny_model_dir, tmp_path):
    # Reference: this process, 4 devices (conftest's XLA_FLAGS), mesh fsdp=4.
    one = Learner(LearnerConfig.model_validate(CFG), tiny_model_dir)
    ref = [grpo_step(one, one.cfg.grpo, toy_batch(s)) for s in (0, 1)]
    ref_lora = one.save_for_sampler().tensors

    group = start_learner(LearnerConfig.model_validate({**CFG, "hosts": 2}), tiny_model_dir, tmp_path / "ckpt",
                          actor_options=fake_devices(2))
    assert isinstance(group, LearnerGroup)
    try:
        devices = ray.get(group.devices.remote(), timeout=300)
        assert len(devices) == 4, f"the 2-process mesh should span 4 devices, got {devices}"
        learner = LearnerHandle(group)
        got = [grpo_step(learner, one.cfg.grpo, toy_batch(s)) for s in (0, 1)]
        adapter = ray.get(group.call.remote("save_for_sampler"), timeout=120)
        lora, config = adapter.tensors, adapter.config
        for r, g in zip(ref, got):
            for key in ("learner/loss", "learner/grad_norm", "learner/kl", "learner/entropy"):
                assert abs(r[key] - g[key]) <= TOL * max(1.0, abs(r[key])), f"{key}: 1 process {r[key]} vs 2 {g[key]}"
        assert got[1]["learner/grad_norm"] > 0, "vacuous: no gradient in the second step"
        assert sorted(lora) == sorted(ref_lora) and config["r"] == 16
        moved = max(float(np.abs(v).max()) for k, v in ref_lora.items() if "lora_B" in k)
        assert moved > 1e-3, "vacuous: the LoRA B weights did not move"
        worst = max(float(np.abs(lora[k] - ref_lora[k]).max()) for k in ref_lora)
        assert worst <= TOL, f"updated LoRA differs by {worst} between 1 and 2 processes (sharded update or gather bug)"

        # Orbax across processes: save, take another step, restore -> the saved weights and step come back.
        ray.get(group.call.remote("save", 2, {"data": {"pos": 7}}), timeout=120)
        grpo_step(learner, one.cfg.grpo, toy_batch(2))
        step, extra = ray.get(group.call.remote("restore"), timeout=120)
        restored = ray.get(group.call.remote("save_for_sampler"), timeout=120).tensors
        assert (step, extra) == (2, {"data": {"pos": 7}})
        assert all(np.array_equal(restored[k], lora[k]) for k in lora), "restore did not bring back step 2's LoRA"
    finally:
        group.kill()


def test_killed_learner_process_stops_the_run_then_resume_continues(tmp_path, tiny_model_dir):
    """Kill one of 2 learner processes once step 2 is checkpointed (the fault hook, at the phase between steps 2 and
    3): the run stops in bounded time naming the lost process; `--resume` continues after the last checkpoint."""
    from orchestration.metrics import read_metrics
    from test_train_e2e import CONFIG, TINY, assert_finite_rows, clean_env, run_train, train_cmd

    run_dir = tmp_path / "run"
    args = ["--config", str(CONFIG), "--run-dir", str(run_dir), *TINY, "learner.hosts=2", "train.steps=4",
            "train.save_every=1"]
    env = clean_env() | {"AHA_FAULT": "between:kill_learner@2"}  # one process of the group (faults.py)
    # Bounded: the group is torn down at once, no hang in a collective.
    proc = subprocess.run(train_cmd(*args), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=STOP_BOUND_S + 900)
    out = proc.stdout
    assert proc.returncode != 0, "a run that lost a learner process must not report success"
    assert "multi-controller JAX cannot go on without every process" in out, f"no clear reason given:\n{out[-3000:]}"
    done = [r["step"] for r in read_metrics(run_dir)]
    saved = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved >= 2 and done[:2] == [1, 2], (saved, done)

    run_train(["--resume", str(run_dir)])
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows if r["step"] > saved] == list(range(saved + 1, 5)), [r["step"] for r in rows]
    assert_finite_rows(rows)
