"""The reward catalogue: every reward a config can name, and how a named reward is built from its params.

The one list of reward names. `rewards.config` validates terms against it and `rewards.registry` builds the
scoring set from it; neither imports the other's module for this, so there is no import cycle.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from rewards.countdown import CountdownReward
from rewards.format import FormatReward
from rewards.judge import JudgeReward
from rewards.math_answer import MathAnswerReward
from rewards.repetition import RepetitionPenalty
from rewards.types import RewardFn

REWARDS: dict[str, type] = {
    "countdown": CountdownReward,
    "math_answer": MathAnswerReward,
    "format": FormatReward,
    "repetition": RepetitionPenalty,
    "judge": JudgeReward,
}


def build_reward(name: str, params: dict[str, Any], where: str) -> RewardFn:
    """The reward `name` built from `params`; bad params -> ValueError naming `where` and the field."""
    if name not in REWARDS:
        raise ValueError(f"{where}: unknown reward {name!r}; choose one of {sorted(REWARDS)}")
    try:
        return REWARDS[name](**params)
    except ValidationError as exc:
        problems = "; ".join(f"params.{'.'.join(map(str, e['loc'])) or '?'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{where} ({name}): {problems}") from None
