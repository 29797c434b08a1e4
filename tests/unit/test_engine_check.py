"""The first-step engine check: a learner/engine gap beyond the bound stops the run with one line naming the
family and the gap; later steps, small gaps and a disabled check pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.config.files import load_config
from orchestration.update import EngineMismatchError, check_engine_agreement
from common.model_cache import model_dir

DEMO = Path(__file__).resolve().parents[2] / "configs" / "countdown_smollm2_cpu.yaml"


@pytest.fixture
def cfg():
    if not (model_dir("tiny-gemma3") / "config.json").exists():
        pytest.fail("tiny-gemma3 not prepared: run `python -m orchestration.cli.prepare_model` in the engine env")
    return load_config(DEMO, ["model.path=tiny-gemma3"])


def test_a_wrong_model_stops_at_the_first_step_naming_family_and_gap(cfg):
    with pytest.raises(EngineMismatchError, match=r"^gemma3: learner and engine logprobs differ by 0\.42 per token"):
        check_engine_agreement(cfg, 1, {"learner/logprob_abs_diff": 0.42})


def test_small_gaps_later_steps_and_off_pass(cfg):
    check_engine_agreement(cfg, 1, {"learner/logprob_abs_diff": 5e-4})
    check_engine_agreement(cfg, 2, {"learner/logprob_abs_diff": 0.42})  # training moved the policy since
    off = load_config(DEMO, ["model.path=tiny-gemma3", "learner.engine_check=false"])
    check_engine_agreement(off, 1, {"learner/logprob_abs_diff": 0.42})
    assert load_config(DEMO, ["learner.param_dtype=bfloat16"]).learner.engine_gap_bound == 5e-2
