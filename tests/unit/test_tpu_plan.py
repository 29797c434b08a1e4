"""Preflight's TPU lines (orchestration/cluster/tpu_plan.py) for every shipped TPU config: one line per process,
with the variables the driver sets when it starts that process. Fails on main at 85b20f9 (preflight printed no TPU
variables there: orchestration/cluster/tpu_plan.py does not exist)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.cluster.launch import engine_replica_env, learner_process_env
from orchestration.cluster.tpu_plan import KEYS, describe, planned_envs
from orchestration.config.files import load_config

ROOT = Path(__file__).resolve().parents[2]
TPU_CONFIGS = sorted((ROOT / "configs").glob("*tpu*.yaml"))


@pytest.mark.parametrize("config", TPU_CONFIGS, ids=lambda p: p.stem)
def test_preflight_shows_every_tpu_process_and_its_variables(config):
    cfg = load_config(config)
    lines = describe(cfg)
    processes = cfg.learner.hosts + cfg.rollout.replicas
    shown = [line for line in lines if line.startswith(("  learner process", "  engine replica"))]
    assert len(shown) == processes, lines
    assert all(all(f"{k}=" in line for k in KEYS) for line in shown)
    engines = [env for name, env in planned_envs(cfg) if name.startswith("engine")]
    assert engines == engine_replica_env(cfg)
    if cfg.learner.hosts == 1:
        assert [env for name, env in planned_envs(cfg) if name.startswith("learner")] == learner_process_env(cfg, None)


def test_the_split_v5e16_learner_notes_rays_reading():
    """The v5e-16 learner's 2x4 is a row of hosts along y as libtpu names it and along x as Ray places it."""
    lines = describe(load_config(ROOT / "configs" / "countdown_qwen2.5-7b_tpu_v5e16.yaml"))
    assert any(line.startswith("  note: Ray 2.60 reads 2x4") and "TPU_PROCESS_BOUNDS=2,1,1" in line for line in lines)


def test_a_whole_host_learner_shows_no_chip_bounds():
    lines = describe(load_config(ROOT / "configs" / "math_gemma3-1b_tpu_2hosts.yaml"))
    [learner] = [line for line in lines if line.startswith("  learner process")]
    assert "TPU_CHIPS_PER_PROCESS_BOUNDS=-" in learner, learner


def test_nothing_on_tpu_shows_nothing():
    assert describe(load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml")) == []
