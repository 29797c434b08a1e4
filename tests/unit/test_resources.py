"""What the learner and the engine ask Ray for, against a cluster's nodes: one line naming what is missing."""

from __future__ import annotations

from pathlib import Path

from orchestration.config.files import load_config
from orchestration.cluster.resources import demands, shortfall

ROOT = Path(__file__).resolve().parents[2]
TPU_HOST = load_config(ROOT / "configs" / "countdown_qwen2.5-1.5b_tpu_v5e8.yaml")
DEMO = load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml")


def test_demands_come_from_each_actors_resources():
    assert demands(TPU_HOST) == {"learner": {"CPU": 4.0, "TPU": 4.0}, "engine": {"CPU": 4.0, "TPU": 4.0}}
    assert demands(DEMO) == {"learner": {"CPU": 1.0}, "engine": {"CPU": 1.0}}


def test_a_cluster_without_the_chips_is_named_with_the_keys_to_change():
    line = shortfall(demands(TPU_HOST), [{"CPU": 9.0, "memory": 1e10}])
    assert line == ("learner asks TPU: 4 and the engine TPU: 4; this cluster has TPU: 0; run on a TPU VM (its Ray "
                    "node reports the chips as TPU), or lower learner.resources.tpu and rollout.resources.tpu")


def test_enough_in_total_but_not_on_one_node():
    asks = {"learner": {"CPU": 1.0, "TPU": 8.0}, "engine": {"CPU": 1.0, "TPU": 4.0}}
    two_hosts = [{"CPU": 8.0, "TPU": 4.0}, {"CPU": 8.0, "TPU": 4.0}, {"CPU": 8.0, "TPU": 4.0}]
    assert shortfall(asks, two_hosts) == ("the learner asks TPU: 8 on one node, but the largest node has TPU: 4; "
                                          "lower learner.resources.tpu to 4 or less")


def test_a_cluster_that_holds_the_run_passes():
    assert shortfall(demands(TPU_HOST), [{"CPU": 96.0, "TPU": 8.0}]) is None
    assert shortfall(demands(TPU_HOST), [{"CPU": 8.0, "TPU": 4.0}, {"CPU": 8.0, "TPU": 4.0}]) is None
    assert shortfall(demands(DEMO), [{"CPU": 3.0}]) is None
    assert "this cluster has CPU: 1" in shortfall(demands(DEMO), [{"CPU": 1.0}])
