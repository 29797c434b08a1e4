"""LearnerActor under a real (local, private) Ray cluster: it lands on its device slice, steps, and ships the
adapter as PEFT-named numpy arrays through the object store."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import ray

from learner.actor import start_learner_actor
from learner.handle import LearnerHandle
from learner.config import LearnerConfig
from orchestration.update import plan_update
from test_learner_checkpoint import toy_batch

pytestmark = pytest.mark.integration


@pytest.fixture
def local_ray():
    # address="local" starts a private cluster (never attaches to someone else's); its own short temp dir.
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_lrn_"),
             log_to_driver=False)
    yield
    ray.shutdown()


def test_actor_steps_on_its_slice_and_ships_tensors(local_ray, tiny_model_dir):
    cfg = LearnerConfig.model_validate({"devices": {"offset": 2, "count": 2}, "seq_bucket": 16})
    env = {"env_vars": {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}}
    actor = start_learner_actor(cfg, tiny_model_dir, actor_options={"num_cpus": 1, "runtime_env": env})
    assert ray.get(actor.devices.remote(), timeout=300) == ["cpu:2", "cpu:3"]
    learner = LearnerHandle(actor)
    batch = plan_update(cfg.grpo, toy_batch(0)).minis[0]
    metrics = {**learner.forward_backward(batch, "grpo").result(), **learner.optim_step().result()}
    assert np.isfinite(metrics["learner/loss"]) and metrics["learner/grad_norm"] > 0
    adapter = ray.get(actor.call.remote("save_for_sampler", "policy", "policy-v1"), timeout=60)
    tensors, config = adapter.tensors, adapter.config
    assert adapter.name == "policy-v1" and config["r"] == 16 and len(tensors) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].shape == (128, 16)
