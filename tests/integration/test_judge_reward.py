"""The judge reward through a real vLLM server (SmolLM2-135M-Instruct), wired as a training run wires it.

A model this small cannot grade arithmetic (asked few-shot whether `12 + 7 = 84` is right, it said yes to every
equation we tried), and a random tiny model grades at random; either would make a test that passes by luck. So
the rubric forces the answer through the prompt: the completion states its own verdict (`VERDICT=yes`) and the
few-shot rubric asks the judge to copy it, which SmolLM2-135M does reliably. What is checked is everything around
the model's judgement: the rubric is rendered per sample, sent to the base model (not the adapter being trained),
the reply parsed strictly and mapped to a score, a malformed reply scored per `rewards.on_error`, and cached.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.config.files import load_config
from orchestration.judge import judge_term, setup_judge
from rewards import Sample, setup_rewards
from rollout.config import RolloutConfig, VllmConfig
from common.lora_adapter import LoraAdapter
from common.peft_adapter import random_peft_adapter
from conftest import running_rollout

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "countdown_smollm2_cpu.yaml"

COPY_RUBRIC = ("Reply: I am sure. VERDICT=yes\nVerdict: yes\n\nReply: Not this one. VERDICT=no\nVerdict: no\n\n"
               "Reply: {completion}\nVerdict:")
JUDGE = {"template": COPY_RUBRIC, "chat": False, "grades": {"yes": 1.0, "no": 0.0},
         "sampling": {"temperature": 0.0, "max_tokens": 3, "stop": ["\n"]}}
GOOD = Sample("Make 19 from [12, 7]", "12 + 7 = 19. VERDICT=yes", {"numbers": [12, 7], "target": 19})
BAD = Sample("Make 19 from [12, 7]", "12 * 7 = 19. VERDICT=no", {"numbers": [12, 7], "target": 19})
MALFORMED = Sample("Make 19 from [12, 7]", "I am not sure. VERDICT=maybe", {"numbers": [12, 7], "target": 19})


@pytest.fixture(scope="module")
def policy(smollm2_dir):
    """The training engine of a run whose judge term says `engine: policy`."""
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=1024, max_lora_rank=8, kv_cache_space_gb=1))
    with running_rollout(cfg, smollm2_dir) as rollout:
        yield rollout


def judged_rewards(policy, on_error: str = "zero", **params):
    """The reward set of a run with one judge term on the training engine, bound by the loop's own wiring."""
    term = {"name": "judge", "params": {**JUDGE, **params}}
    cfg = load_config(CONFIG, [f"rewards.terms=[{term}]", f"rewards.on_error={on_error}"])
    rewards = setup_rewards(cfg.rewards)
    assert setup_judge(cfg, rewards, policy) is None, "engine: policy must not start an engine of its own"
    return rewards


def test_known_good_and_known_bad_answers_score_one_and_zero_batched_and_cached(policy):
    rewards = judged_rewards(policy)
    result = rewards.score([GOOD, BAD, GOOD])
    assert result.per_name["judge"] == [1.0, 0.0, 1.0] and result.errors == []
    m = result.counters
    assert m["judge/requests"] == 2 and m["judge/cache_hits"] == 1, "the repeated sample was sent twice"
    assert m["judge/completion_tokens"] >= 2 and m["judge/prompt_tokens"] > 2 * 20 and m["judge/seconds"] > 0
    again = rewards.score([BAD, GOOD])
    assert again.per_name["judge"] == [0.0, 1.0]
    assert again.counters["judge/requests"] == 0 and again.counters["judge/cache_hits"] == 2


def test_the_judge_asks_the_base_model_while_the_policy_has_an_adapter(policy, smollm2_dir):
    """Serving an adapter that changes the model's reply to the rubric leaves the judge's grades as they were."""
    judge = judge_term(judged_rewards(policy, cache_size=0))
    prompts = [judge.prompt(s) for s in (GOOD, BAD)]
    before = [r.text for r in judge.engine.complete(prompts, judge.params.sampling, [1, 2])]
    tensors, config = random_peft_adapter(smollm2_dir, rank=8, seed=0, scale=0.5)
    policy.serve(LoraAdapter("policy-v1", tensors, {**config, "base_model_name_or_path": str(smollm2_dir)}))
    try:
        ids = [judge.engine.encode(p) for p in prompts]
        with_adapter = [g[0].text for g in policy.generate(ids, judge.params.sampling, adapter="policy-v1")]
        assert with_adapter != before, "the adapter did not change the reply: the check below would prove nothing"
        after = [r.text for r in judge.engine.complete(prompts, judge.params.sampling, [1, 2])]
        assert after == before, f"the judge answered with the adapter: {after} (base: {before})"
        assert judge.parse(after[0]) == 1.0 and judge.parse(after[1]) == 0.0
    finally:
        policy.unserve("policy-v1")


def test_a_malformed_reply_scores_per_on_error(policy, caplog):
    rewards = judged_rewards(policy, on_error="zero")
    result = rewards.score([GOOD, MALFORMED])
    assert result.per_name["judge"] == [1.0, 0.0]
    assert len(result.errors) == 1 and "judge replied ' maybe', not one of the grades ['no', 'yes']" in result.errors[0]
    assert "sample 1" in result.errors[0] and result.counters["judge/malformed"] == 1
    with pytest.raises(RuntimeError, match="judge replied ' maybe'"):
        judged_rewards(policy, on_error="fail").score([GOOD, MALFORMED])


def test_a_rubric_too_long_for_the_engine_fails_that_sample_only(policy):
    rewards = judged_rewards(policy)
    result = rewards.score([Sample("p", "word " * 2000 + "VERDICT=yes", {}), GOOD])
    assert result.per_name["judge"] == [0.0, 1.0]
    assert len(result.errors) == 1 and "exceeds the judge engine's max_model_len (1024)" in result.errors[0]
