"""Registry, config and the weighted combination: errors are per sample, logged, and follow the config's policy."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys

import pytest
from pydantic import ValidationError

from rewards import REWARDS, RewardsConfig, RewardSet, RewardTerm, Sample, score_batch, setup_rewards
from rewards.countdown import CountdownReward
from rewards.format import FormatReward

CORRECT = "<think>3*7=21</think>\n<answer>25 + 3 * 7</answer>"
REF = {"numbers": [3, 7, 25], "target": 46}


class ExplodingReward:
    """A stand-in reward (tiny, real, picklable) that raises on completions containing 'boom', else returns 1."""

    __name__ = "exploding"

    def __call__(self, sample: Sample) -> float:
        if "boom" in sample.completion:
            raise ValueError("boom found")
        return float("nan") if "nan" in sample.completion else 1.0


def test_weighted_totals_and_unweighted_per_name() -> None:
    cfg = RewardsConfig(terms=[{"name": "countdown"}, {"name": "format", "weight": 0.5}, {"name": "repetition"}])
    result = setup_rewards(cfg).score([Sample("p0", CORRECT, REF), Sample("p1", "<answer>25</answer>", REF)])
    assert result.per_name == {"countdown": [1.0, 0.1], "format": [1.0, 0.5], "repetition": [0.0, 0.0]}
    assert result.totals == pytest.approx([1.5, 0.35])
    assert result.errors == []
    assert set(result.seconds) == {"countdown", "format", "repetition"}


def test_error_zero_keeps_other_samples_and_logs_the_line(caplog) -> None:
    rewards = RewardSet([ExplodingReward(), FormatReward()], [1.0, 1.0], on_error="zero")
    samples = [Sample("p", CORRECT, {}), Sample("p", "boom " + "x" * 200, {}), Sample("p", "nan", {})]
    with caplog.at_level(logging.ERROR, logger="rewards.registry"):
        result = rewards.score(samples)
    assert result.per_name["exploding"] == [1.0, 0.0, 0.0]
    assert result.per_name["format"] == [1.0, 0.0, 0.0]
    assert result.totals == [2.0, 0.0, 0.0]
    assert len(result.errors) == 2
    line = result.errors[0]
    assert line.startswith("reward exploding raised ValueError('boom found') on sample 1: completion 'boom xxx")
    assert "\n" not in line and len(line) < 200, "error lines must be one short line"
    assert "returned nan" in result.errors[1] and "sample 2" in result.errors[1]
    assert [r.getMessage().split(" (scored 0")[0] for r in caplog.records] == result.errors


def test_error_fail_raises_with_the_line() -> None:
    rewards = RewardSet([ExplodingReward()], [1.0], on_error="fail")
    with pytest.raises(RuntimeError, match=r"reward exploding raised ValueError\('boom found'\) on sample 1"):
        rewards.score([Sample("p", "fine", {}), Sample("p", "boom", {})])


def test_missing_reference_field_is_a_reported_error() -> None:
    result = score_batch([Sample("p", CORRECT, {"numbers": [3, 7, 25]})], [RewardTerm(name="countdown")])
    assert result.per_name["countdown"] == [0.0]
    assert result.errors == [f"reward countdown raised KeyError('target') on sample 0: completion {CORRECT!r}"]


def test_bad_params_name_the_term_and_field() -> None:
    terms = [{"name": "format"}, {"name": "repetition", "params": {"ngram": 0, "tiers": [[0.2, 1.0]], "n": 3}}]
    with pytest.raises(ValidationError) as info:
        RewardsConfig(terms=terms)
    message = str(info.value)
    assert "rewards.terms[1] (repetition)" in message
    assert "params.ngram" in message and "params.tiers" in message and "params.n: Unexpected keyword" in message


@pytest.mark.parametrize(
    "terms, match",
    [
        ([], "at least 1 item"),
        ([{"name": "countdwn"}], "countdown"),
        ([{"name": "format"}, {"name": "format", "weight": 2}], "appears 2 times"),
        ([{"name": "format", "wieght": 2}], "wieght"),
    ],
)
def test_bad_config(terms: list, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        RewardsConfig(terms=terms)


def test_every_registered_reward_pickles_and_names_itself() -> None:
    samples = [Sample("p", CORRECT, {**REF, "answer": "46"}), Sample("p", "no no no no " * 20, {**REF, "answer": "1"})]
    pure = [name for name in REWARDS if name != "judge"]  # the judge needs an engine: tests/unit/test_judge_reward.py
    for name in pure:
        fn = REWARDS[name]()
        assert fn.__name__ == name
        clone = pickle.loads(pickle.dumps(fn))
        assert [clone(s) for s in samples] == [fn(s) for s in samples]
    rewards = setup_rewards(RewardsConfig(terms=[{"name": name} for name in pure]))
    assert rewards.names == pure
    assert pickle.loads(pickle.dumps(rewards)).score(samples).totals == rewards.score(samples).totals


def test_params_reach_the_reward() -> None:
    fn = setup_rewards(RewardsConfig(terms=[{"name": "countdown", "params": {"format_score": 0.2}}])).fns[0]
    assert fn == CountdownReward(format_score=0.2)


def test_import_rewards_pulls_no_heavy_framework() -> None:
    code = "import sys, rewards; print(sorted(m for m in ('jax', 'torch', 'vllm', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"`import rewards` imported {out.strip()}: rewards must run in any Ray worker cheaply"
