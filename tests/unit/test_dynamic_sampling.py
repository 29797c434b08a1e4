"""Dynamic sampling's refill (orchestration/dynamic_sampling.py) on real prompt streams and reward results.

The draw function here is the loop's contract in miniature: it takes prompts from a real `PromptStream` and gives
each group the rewards a fixed table holds for its prompt (a stand-in for the engine's samples, which the
integration test takes from vLLM). What is checked is the refill itself: which groups are kept, how many prompts
each draw takes, where it stops, and that the stream position after a step redraws the same prompts.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestration.config.files import load_config
from orchestration.dynamic_sampling import Drawn, fill_batch, refill_size
from orchestration.loop import request_seeds
from rewards.registry import RewardResult
from common.sampling import Completion
from tasks import DataConfig, PromptStream, setup_dataset

ROOT = Path(__file__).resolve().parents[2]

GROUP = 4


def stream() -> PromptStream:
    return PromptStream(setup_dataset(DataConfig(train_size=50), "train"), batch_size=4, seed=3)


def drawer(source: PromptStream, varies, calls: list):
    """draw(count, first) over `source`; group rewards vary when varies(prompt uid) is true."""

    def draw(count: int, first: int) -> Drawn:
        calls.append((count, first))
        prompts = source.next_batch(count)
        groups = [[Completion([1, 2], [-0.1, -0.2], "x", "stop") for _ in range(GROUP)] for _ in prompts]
        totals = [float(i % 2) if varies(p.uid) else 0.5 for p in prompts for i in range(GROUP)]
        return Drawn(prompts, [[7]] * len(prompts), [p.uid for p in prompts], groups,
                     [RewardResult(totals, {"r": totals}, [])], totals, {"generate": 1.0, "score": 0.1})

    return draw


def test_refill_fills_the_batch_with_varying_groups_in_draw_order():
    source, calls = stream(), []
    varies = lambda uid: int(uid[-6:]) % 3 == 0  # noqa: E731 - a third of the prompts vary
    drawn, kept, metrics = fill_batch(drawer(source, varies, calls), quota=4, max_draws=10)
    assert len(kept) == 4
    assert all(varies(drawn.prompts[g].uid) for g in kept), "a constant group was kept"
    assert kept == sorted(kept) and kept == drawn.varying()[:4], "kept groups are not the first varying ones"
    batch = drawn.take(kept)
    assert len(batch.prompts) == len(batch.completions) == len(batch.texts) == 4 and len(batch.totals) == 4 * GROUP
    assert batch.texts == [drawn.prompts[g].uid for g in kept], "a kept group's prompt text is another group's"
    assert [first for _, first in calls] == [sum(c for c, _ in calls[:i]) for i in range(len(calls))], \
        "a refill's first prompt index must continue the step's (request seeds)"
    assert calls[0] == (4, 0), "the first draw is prompts_per_step prompts, as without dynamic sampling"
    assert metrics["dynamic/draws"] == len(calls) and metrics["dynamic/kept_groups"] == 4
    assert metrics["dynamic/drawn_groups"] == len(drawn.prompts) == sum(c for c, _ in calls)
    assert metrics["dynamic/filtered_frac"] == pytest.approx(1 - metrics["dynamic/varying_groups"] / len(drawn.prompts))
    assert metrics["dynamic/bound_hit"] == 0


def test_refill_draws_what_is_missing_over_the_varying_share():
    assert refill_size(missing=2, drawn=4, varying=2, quota=4) == 4
    assert refill_size(missing=1, drawn=4, varying=3, quota=4) == 2
    assert refill_size(missing=1, drawn=8, varying=7, quota=8) == 2
    assert refill_size(missing=4, drawn=4, varying=0, quota=4) == 4, "nothing varied yet: a full draw"
    assert refill_size(missing=3, drawn=40, varying=1, quota=4) == 4, "at most prompts_per_step"


def test_the_draw_bound_stops_the_step_and_trains_on_what_there_is(caplog):
    caplog.set_level(logging.INFO, logger="orchestration.dynamic_sampling")
    source, calls = stream(), []
    only_first = {source.next_batch(1)[0].uid}  # peek: the first prompt of a fresh stream of the same seed
    source = stream()
    drawn, kept, metrics = fill_batch(drawer(source, lambda uid: uid in only_first, calls), 4, max_draws=3, step=9)
    assert len(calls) == 3, "more draws than train.dynamic_sampling.max_draws"
    assert kept == [0] and drawn.prompts[0].uid in only_first, "the step trains on the one varying group"
    assert metrics["dynamic/bound_hit"] == 1 and metrics["dynamic/kept_groups"] == 1
    assert "step 9: 1 of 4 groups with varying rewards after 3 draws" in caplog.text


def test_with_no_varying_group_the_step_trains_on_its_first_draw():
    calls: list = []
    drawn, kept, metrics = fill_batch(drawer(stream(), lambda uid: False, calls), 4, max_draws=2)
    assert kept == [0, 1, 2, 3] and len(calls) == 2
    assert metrics["dynamic/kept_groups"] == 0 and metrics["dynamic/filtered_frac"] == 1.0
    assert Drawn.join([drawn]).seconds == {"generate": 2.0, "score": 0.2}, "phase times are summed over draws"


def test_the_stream_position_after_refills_redraws_the_same_prompts():
    """A checkpoint records the stream after a step's last draw: a resumed run continues with the same prompts."""
    varies = lambda uid: int(uid[-6:]) % 4 == 1  # noqa: E731
    first, resumed = stream(), stream()
    steps = []
    for _ in range(3):
        drawn, kept, _ = fill_batch(drawer(first, varies, []), 4, max_draws=5)
        steps.append(([p.uid for p in drawn.prompts], first.state_dict()))
    resumed.load_state_dict(steps[0][1])
    drawn, kept, _ = fill_batch(drawer(resumed, varies, []), 4, max_draws=5)
    assert [p.uid for p in drawn.prompts] == steps[1][0]
    assert resumed.state_dict() == steps[1][1]


def test_refill_request_seeds_continue_the_step_and_the_first_draw_keeps_its_seeds():
    cfg = load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml")
    whole = request_seeds(cfg, 5, 10)
    assert request_seeds(cfg, 5, 4) == whole[:4], "dynamic sampling changed the first draw's seeds"
    assert request_seeds(cfg, 5, 6, first=4) == whole[4:]


def test_next_batch_takes_any_count_across_epochs():
    s = PromptStream(setup_dataset(DataConfig(train_size=5), "train"), batch_size=2, seed=0)
    got = [p.uid for p in s.next_batch(3) + s.next_batch(4) + s.next_batch()]
    whole = PromptStream(setup_dataset(DataConfig(train_size=5), "train"), batch_size=9, seed=0).next_batch()
    assert got == [p.uid for p in whole]
    with pytest.raises(ValueError, match="count must be >= 1"):
        s.next_batch(0)


def test_dynamic_sampling_config_is_checked():
    cfg = load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml",
                      ["train.dynamic_sampling.enabled=true", "train.dynamic_sampling.max_draws=3"])
    assert cfg.train.dynamic_sampling.max_draws == 3
    from orchestration.config.errors import ConfigError

    with pytest.raises(ConfigError, match="train.dynamic_sampling.max_draws"):
        load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml", ["train.dynamic_sampling.max_draws=0"])


def test_a_refill_is_a_fault_phase():
    from orchestration.faults import Fault, parse

    assert parse("refill:sigint@2") == [Fault("refill", "sigint", 2)]
