"""Engine replicas for real: two vLLM servers, each behind its own RolloutServer actor, under one RolloutFleet.

The whole loop scaled out (rollout.replicas=2, learner.hosts=2, one replica killed between steps 1 and 2 by
`AHA_FAULT=between:kill_engine@1`) runs in test_train_e2e.py's `ray job submit` test.
"""

from __future__ import annotations

import os
import signal
import tempfile

import pytest

from rollout.config import RolloutConfig, VllmConfig
from rollout.fleet import RolloutFleet
from common.lora_adapter import LoraAdapter
from common.peft_adapter import random_peft_adapter
from common.sampling import SamplingParams

pytestmark = pytest.mark.integration


def test_fleet_spreads_groups_and_serves_every_version_on_all(tiny_model_dir):
    """Two real vLLM replicas: groups land on both, each group's n samples on one, every sample made by the adapter
    its request named; a replica whose engine is killed between steps misses no version: it is rebuilt serving what
    the fleet serves while the other serves."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, max_lora_rank=8, kv_cache_space_gb=1), replicas=2)
    params = SamplingParams(n=3, max_tokens=4, temperature=1.0, ignore_eos=True)
    prompts = [[1, 2, 3 + i] for i in range(6)]
    try:
        with RolloutFleet(cfg, tiny_model_dir, actor_options={"num_cpus": 0}) as fleet:
            fleet.serve(LoraAdapter("policy-v1", *random_peft_adapter(tiny_model_dir, 8, seed=1, scale=0.02)))
            groups = fleet.generate(prompts, params, adapter="policy-v1")
            assert [len(g) for g in groups] == [3] * 6
            assert {c.adapter for g in groups for c in g} == {"policy-v1"}
            metrics = fleet.metrics()
            counts = [metrics[f"rollout/replica{i}/requests"] for i in (0, 1)]
            assert counts == [3.0, 3.0], f"6 groups at once should split 3/3 by least outstanding, got {counts}"

            victim = ray.get(fleet.replicas[1].rollout.actor.pid.remote())
            os.killpg(victim, signal.SIGKILL)
            fleet.serve(LoraAdapter("policy-v2", *random_peft_adapter(tiny_model_dir, 8, seed=2, scale=0.02)))
            fleet.unserve("policy-v1")
            assert set(fleet.served) == {"policy-v2"}
            groups = fleet.generate(prompts, params, adapter="policy-v2")
            assert {c.adapter for g in groups for c in g} == {"policy-v2"}, "a replica answered another adapter"
            assert fleet.events, "the dead replica's restart was not recorded"
            assert sum(fleet.metrics()[f"rollout/replica{i}/restarts"] for i in (0, 1)) >= 1
    finally:
        ray.shutdown()
