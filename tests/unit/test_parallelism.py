"""Chips, hosts and tensor parallelism are checked at load, with one line naming the key, the value and the fix.

Finding 6 of issue 27: on main configs/math_gemma3-1b_tpu_2hosts.yaml asked vllm-tpu for tensor parallelism 8 over
a model with 4 attention heads and loaded without a word (vLLM refuses it minutes into the run), and nothing tied
learner.topology to learner.hosts x chips. `test_tensor_parallelism_must_split_the_heads` and
`test_topology_is_hosts_times_chips` fail on main.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestration.config.errors import ConfigError
from orchestration.config.files import load_config
from orchestration.config.parallelism import report, tp_problem

ROOT = Path(__file__).resolve().parents[2]
V5E8 = ROOT / "configs" / "countdown_qwen2.5-1.5b_tpu_v5e8.yaml"
V5E16 = ROOT / "configs" / "countdown_qwen2.5-7b_tpu_v5e16.yaml"
GEMMA = ROOT / "configs" / "math_gemma3-1b_tpu_2hosts.yaml"


def refusal(path: Path, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    line = str(info.value)
    assert "\n" not in line, line
    return line


def test_tensor_parallelism_must_split_the_heads():
    """The Gemma TPU config as it shipped (TP 8, 8 chips per engine): Gemma 3 1B has 4 attention heads."""
    line = refusal(GEMMA, ["rollout.backend.tensor_parallel_size=8", "rollout.resources.tpu=8",
                           "rollout.replicas=1"])
    assert line.startswith("rollout.backend.tensor_parallel_size (8) does not divide the model's 4 attention heads")
    assert "use one of 1, 2, 4" in line and "gemma-3-1b-it/config.json" in line


@pytest.mark.parametrize(("q", "kv", "tp", "ok"), [
    (12, 2, 4, True),    # Qwen2.5-1.5B at TP 4: its 2 KV heads replicated twice
    (12, 2, 3, False),   # 3 divides 12 but is no multiple of 2 KV heads
    (28, 4, 4, True),    # Qwen2.5-7B
    (28, 4, 2, True),    # 4 KV heads split over 2
    (24, 6, 4, False),   # 6 KV heads cannot be split over 4
    (4, 1, 4, True),     # Gemma 3 1B: one KV head replicated
    (4, 1, 8, False),
])
def test_kv_heads_follow_vllms_split_or_replicate_rule(q, kv, tp, ok):
    """vllm 0.32.0 QKVParallelLinear (vllm/model_executor/layers/linear.py:1053-1057): tp >= KV heads replicates
    (tp % kv must be 0), else splits (kv % tp must be 0); attention heads always divide (config/model.py:1546)."""
    assert (tp_problem(tp, {"num_attention_heads": q, "num_key_value_heads": kv}) is None) == ok


def test_topology_is_hosts_times_chips():
    line = refusal(V5E8, ["learner.topology=v5e:2x4"])
    assert line == ("learner.topology v5e:2x4 has 8 chips but learner.hosts (1) x learner.resources.tpu (4) = 4; "
                    "make them equal")
    assert "learner.topology to the learner's chips" in refusal(V5E8, ["learner.topology=cpu"])


def test_a_learner_on_several_hosts_takes_whole_hosts():
    line = refusal(V5E16, ["learner.resources.tpu=2", "learner.topology=v5e:2x2"])
    assert "hold 4 chips each; set learner.resources.tpu: 4" in line


def test_chips_per_actor_are_rays_chip_counts():
    assert "takes 1, 2, 4, 8 chips per actor" in refusal(V5E8, ["learner.resources.tpu=3", "learner.topology=cpu"])
    assert refusal(V5E8, ["rollout.resources.tpu=3"]).startswith("rollout.resources.tpu (3): Ray's TPU resource")


def test_tpu_engine_shards_over_exactly_its_chips():
    line = refusal(V5E8, ["rollout.backend.tensor_parallel_size=2"])
    assert line.startswith("rollout.backend.tensor_parallel_size (2) differs from rollout.resources.tpu (4)")


def test_report_states_the_checked_split():
    cfg = load_config(V5E16)
    hf = json.loads(cfg.model.config_json.read_text())
    assert report(cfg, hf) == ("preflight: parts: learner 2 process(es) x 4 chips = v5e:2x4; engine 2 replica(s) x 4 "
                               "chips, tensor parallel 4 over the model's 28 attention / 4 KV heads")


def test_cpu_configs_are_not_touched():
    cfg = load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml", ["learner.topology=v5e:2x2"])
    assert cfg.learner.resources.tpu == 0  # a CPU learner may still be compiled for a TPU topology by preflight
