"""Dynamic sampling and a judge reward in whole training runs: `python -m orchestration.cli.train` on the tiny model.

A tiny random model scores 0 on every verifiable reward, so no group would vary and no refill would be needed.
Here the reward is a judge on a separate engine (`judge_engine:`, a second tiny-llama server behind its own actor)
whose reply is constrained to the tokens `0` and `1` and sampled at temperature 1: a grade at random but
reproducible (its request seed is a hash of what it grades), so groups of 2 samples vary about half the time and
the refill has work to do. One run of 3 steps is checked as it goes (the batch filled with varying groups, the
draw bound, the judge's cost in the metrics); a copy of it cut back to its step-1 checkpoint and resumed must draw
and score steps 2 and 3 exactly as the uninterrupted run did (nothing of a step in progress is checkpointed, so
this is the resume of a run stopped anywhere in step 2, its refill draws included).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestration.metrics import read_metrics
from test_train_e2e import CONFIG, TINY, run_train, sample_rows

pytestmark = pytest.mark.integration

QUOTA, GROUP, DRAWS = 2, 2, 3
ZERO_ONE = [32, 33]  # the SmolLM2 tokenizer's (tiny-llama's) ids of "0" and "1"
JUDGE = ("rewards.terms=[{name: judge, params: {template: 'Grade this answer 0 or 1. {completion} Grade:', "
         "chat: false, engine: judge, sampling: {temperature: 1.0, max_tokens: 1, "
         "extra: {allowed_token_ids: %s}}}}]" % ZERO_ONE)
RUN = [*TINY, f"rollout.sampling.n={GROUP}", f"train.prompts_per_step={QUOTA}", "train.steps=3", "train.save_every=1",
       "train.seed=7", "rollout.client.max_concurrency=1", "train.dynamic_sampling.enabled=true",
       f"train.dynamic_sampling.max_draws={DRAWS}", JUDGE, "judge_engine.model.path=tiny-llama",
       "judge_engine.backend.kind=vllm", "judge_engine.backend.max_model_len=512",
       "judge_engine.backend.kv_cache_space_gb=1", "judge_engine.client.max_concurrency=1"]


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory, tiny_model_dir) -> Path:
    run_dir = tmp_path_factory.mktemp("dynamic") / "run"
    run_train(["--config", str(CONFIG), "--run-dir", str(run_dir), *RUN])
    return run_dir


@pytest.fixture(scope="module")
def resumed_from_step_1(judged_run, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dynamic") / "resumed"
    shutil.copytree(judged_run, run_dir)
    for ckpt in (run_dir / "checkpoints").iterdir():
        if ckpt.name.isdigit() and int(ckpt.name) > 1:
            shutil.rmtree(ckpt)
    # The driver's record of the newest save goes back with them (a resume refuses a learner short of it).
    (run_dir / "saved.json").write_text(json.dumps({"step": 1, "checkpoints": str(run_dir / "checkpoints")}))
    run_train(["--resume", str(run_dir)])
    return run_dir


def test_each_step_trains_on_varying_groups_up_to_the_draw_bound(judged_run):
    rows = read_metrics(judged_run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sum(r["dynamic/draws"] for r in rows) > len(rows), "no step refilled: the test would show nothing"
    assert any(r["dynamic/filtered_frac"] > 0 for r in rows), "no group was filtered out"
    for r in rows:
        step = r["step"]
        assert 1 <= r["dynamic/draws"] <= DRAWS, f"step {step}: {r['dynamic/draws']} draws, bound {DRAWS}"
        kept = r["dynamic/kept_groups"]
        assert kept == min(QUOTA, r["dynamic/varying_groups"])
        assert r["dynamic/bound_hit"] == int(kept < QUOTA)
        assert r["dynamic/bound_hit"] or r["dynamic/draws"] < DRAWS or r["dynamic/varying_groups"] >= QUOTA
        # The learner sees the trained batch: only varying groups (or, with none at the bound, the first draw).
        trained = kept if kept else QUOTA
        assert r["learner/trained_samples"] == trained * GROUP, f"step {step}: {r['learner/trained_samples']}"
        assert r["learner/zero_adv_frac"] == (0.0 if kept else 1.0), f"step {step}: a constant group was trained on"
        # The judge's reward and its cost per step.
        assert 0.0 <= r["reward/judge"] <= 1.0 and r["reward/errors"] == 0
        drawn_samples = r["dynamic/drawn_groups"] * GROUP
        assert r["judge/requests"] + r["judge/cache_hits"] == drawn_samples
        assert r["judge/completion_tokens"] == r["judge/requests"], "one token per constrained grade"
        assert r["judge/tokens_per_s"] > 0 and 0 < r["judge/step_share"] < 1


def test_a_run_resumed_mid_way_redraws_and_rescores_every_draw(judged_run, resumed_from_step_1):
    want = {r["step"]: r for r in read_metrics(judged_run)}
    got = {r["step"]: r for r in read_metrics(resumed_from_step_1)}
    assert sorted(got) == [1, 2, 3]
    for step in (2, 3):
        for key in ("dynamic/draws", "dynamic/drawn_groups", "dynamic/varying_groups", "reward/total", "reward/judge",
                    "rollout/completion_len_mean", "learner/trained_samples"):
            assert got[step][key] == want[step][key], f"step {step}: {key} {got[step][key]} != {want[step][key]}"
        assert got[step]["learner/loss"] == pytest.approx(want[step]["learner/loss"], rel=1e-4, abs=1e-6)
    for key in ("prompt", "completions", "rewards"):
        assert sample_rows(resumed_from_step_1, key) == sample_rows(judged_run, key), f"samples.jsonl {key} differ"
    summary = json.loads((resumed_from_step_1 / "summary.json").read_text())
    assert summary["steps"] == 3
