"""The judge reward's pure parts: strict grade parsing, rubric rendering, params and run-config checks.

Scoring through an engine (batching, cache, on_error, base model vs adapter) is tested against real vLLM servers in
tests/integration/test_judge_reward.py.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestration.config.errors import ConfigError
from orchestration.config.files import load_config
from orchestration.judge import judge_step_metrics
from rewards import RewardsConfig, Sample, setup_rewards
from rewards.judge import JudgeReward, MalformedGrade

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "countdown_smollm2_cpu.yaml"
RUBRIC = "Numbers {reference[numbers]}, target {reference[target]}. Answer: {completion}\nGrade 0 or 1:"


def test_grades_parse_strictly():
    judge = JudgeReward(template=RUBRIC)
    assert judge.parse("1") == 1.0 and judge.parse(" 0\n") == 0.0
    for bad in ("", "10", "1.", "yes", "Grade: 1", "1 because", "０"):
        with pytest.raises(MalformedGrade, match="not one of the grades"):
            judge.parse(bad)


def test_pattern_and_labels_map_replies_to_scores():
    judge = JudgeReward(template=RUBRIC, pattern=r"GRADE:\s*(\w+)", grades={"good": 1.0, "bad": -0.5})
    assert judge.parse("GRADE: good") == 1.0 and judge.parse("  GRADE:bad ") == -0.5
    for bad in ("GRADE: fine", "The GRADE: good", "GRADE: good.", "good"):
        with pytest.raises(MalformedGrade):
            judge.parse(bad)


def test_rubric_renders_the_sample_and_hostile_braces_stay_text():
    sample = Sample("<prompt>", "{reference} 12 + 7 = {0}", {"numbers": [12, 7], "target": 19})
    chat = JudgeReward(template=RUBRIC, system_prompt="You grade.").prompt(sample)
    assert chat == [{"role": "system", "content": "You grade."},
                    {"role": "user", "content": "Numbers [12, 7], target 19. Answer: {reference} 12 + 7 = {0}\n"
                                                "Grade 0 or 1:"}]
    raw = JudgeReward(template="{prompt}|{completion}", chat=False).prompt(sample)
    assert raw == "<prompt>|{reference} 12 + 7 = {0}"


@pytest.mark.parametrize("params, match", [
    ({"template": "Grade {answer}"}, "template names \\['answer'\\]"),
    ({"template": "Grade {prompt}"}, "never shows the judge the \\{completion\\}"),
    ({"template": RUBRIC, "pattern": "GRADE: \\d"}, "has no group"),
    ({"template": RUBRIC, "pattern": "("}, "is not a regex"),
    ({"template": RUBRIC, "grades": {}}, "grades is empty"),
    ({"template": RUBRIC, "sampling": {"n": 2, "temperature": 1.0}}, "n \\(2\\) must be 1"),
    ({"template": RUBRIC, "engine": "other"}, "engine"),
])
def test_bad_params_fail_when_the_config_is_read(params, match):
    with pytest.raises(ValidationError, match=match):
        RewardsConfig(terms=[{"name": "judge", "params": params}])


def test_an_unbound_judge_says_who_binds_it_and_pickles_without_its_engine():
    judge = setup_rewards(RewardsConfig(terms=[{"name": "judge", "params": {"template": RUBRIC}}])).fns[0]
    judge.bind(object())  # whatever engine: a copy must not carry it
    clone = pickle.loads(pickle.dumps(judge))
    assert clone.engine is None and clone.params == judge.params
    with pytest.raises(RuntimeError, match="has no engine; the training loop binds one"):
        clone.score_batch([Sample("p", "c", {})])


JUDGE_TERM = "rewards.terms=[{name: judge, params: {template: 'Grade {completion}', engine: %s}}]"


def test_run_config_needs_the_judge_engine_the_term_names():
    cfg = load_config(CONFIG, [JUDGE_TERM % "policy"])
    assert cfg.judge_engine is None
    with pytest.raises(ConfigError, match="has engine: judge but there is no judge_engine section"):
        load_config(CONFIG, [JUDGE_TERM % "judge"])
    with pytest.raises(ConfigError, match="judge_engine is set but no judge reward term has engine: judge"):
        load_config(CONFIG, [JUDGE_TERM % "policy", "judge_engine.model.path=tiny-llama"])
    cfg = load_config(CONFIG, [JUDGE_TERM % "judge", "judge_engine.model.path=tiny-llama"])
    assert cfg.judge_engine.backend.kind == "vllm" and not cfg.judge_engine.backend.enable_lora


def test_run_config_checks_the_judge_sampling_against_its_engine():
    long = "rewards.terms=[{name: judge, params: {template: 'Grade {completion}', sampling: {max_tokens: 1024}}}]"
    with pytest.raises(ConfigError, match=r"rewards.terms\[0\].params.sampling.max_tokens \(1024\) leaves no room"):
        load_config(CONFIG, [long])


def test_judge_cost_per_step_is_derived_from_its_counters():
    row = {"judge/seconds": 2.0, "judge/prompt_tokens": 300.0, "judge/completion_tokens": 100.0, "timing/step": 8.0}
    assert judge_step_metrics(row) == {"judge/tokens_per_s": 200.0, "judge/completion_tokens_per_s": 50.0,
                                       "judge/step_share": 0.25}
    assert judge_step_metrics({"timing/step": 3.0}) == {}, "a run without a judge logs no judge figures"
