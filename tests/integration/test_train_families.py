"""Every family through the whole loop: 2 GRPO steps of `python -m orchestration.cli.train` (vLLM + JAX learner + Ray)
on each family's tiny random model, with the learner scoring the engine's samples to <= 1e-3 per token.

Prompts (chat-rendered Countdown, ~100+ tokens) are longer than tiny-gemma3's 16-token sliding window, so a
sliding-window mismatch between vLLM and the learner would show. A model the learner gets wrong stops the run at
the first step with one line naming the family and the gap (forced here with an impossible bound).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestration.metrics import read_metrics
from orchestration.cli.tiny_models import GEMMA3_WINDOW, TINY_FAMILIES, tiny_name
from test_train_e2e import CONFIG, ROOT, TINY, assert_finite_rows, clean_env, run_train, train_cmd

pytestmark = pytest.mark.integration
BOUND = 1e-3


def family_args(family: str) -> list[str]:
    return [a for a in TINY if not a.startswith("model.path=")] + [f"model.path={tiny_name(family)}", "train.steps=2"]


# tiny-llama goes through the same loop in test_train_e2e.py (its uninterrupted run asserts the same bound).
@pytest.mark.parametrize("family", [f for f in TINY_FAMILIES if f != "llama"])
def test_two_grpo_steps_with_learner_and_engine_in_agreement(family, tiny_family_dir, tmp_path):
    from transformers import AutoTokenizer

    run_dir = tmp_path / "run"
    run_train(["--config", str(CONFIG), "--run-dir", str(run_dir), *family_args(family)])
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert_finite_rows(rows)
    gaps = [r["learner/logprob_abs_diff"] for r in rows]
    print(f"{family}: learner/logprob_abs_diff per step {gaps}")
    assert max(gaps) <= BOUND, f"{family}: learner vs engine logprobs differ by {max(gaps):.2e} per token"
    tok = AutoTokenizer.from_pretrained(tiny_family_dir(family))
    prompts = [json.loads(line)["prompt"] for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    shortest = min(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert shortest > GEMMA3_WINDOW, f"prompts of {shortest} tokens do not exceed the sliding window"


def test_a_gap_beyond_the_bound_stops_the_run_at_the_first_step(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--config", str(CONFIG), "--run-dir", str(run_dir), *family_args("gemma3"),
            "learner.max_engine_gap=1e-12"]  # no fp32 pair of implementations agrees this well
    proc = subprocess.run(train_cmd(*args), cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, "a run whose learner disagrees with its engine must not succeed"
    assert "gemma3: learner and engine logprobs differ by" in out, out[-3000:]
    assert read_metrics(run_dir) == [], "the run logged a step after the check failed: it trained on"
