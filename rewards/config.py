"""Which rewards a run uses, their weights and parameters, and what a raising reward does to the step.

Parameters are checked by building the reward at config-validation time, so a typo in `params` fails when the YAML
is loaded (naming the term and the field), not minutes later at the first scoring step.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rewards.catalog import REWARDS, build_reward
from strict_config import Strict


class RewardTerm(Strict):
    """One reward in the weighted sum."""

    name: str
    """A reward of the catalogue (rewards.catalog.REWARDS): countdown, math_answer, format, repetition."""
    weight: float = 1.0
    """Multiplier in the total; the per-reward metrics are logged unweighted."""
    params: dict[str, Any] = {}
    """Keyword arguments of the reward's constructor (e.g. repetition `ngram`/`tiers`, format `think_tag`)."""

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in REWARDS:
            raise ValueError(f"unknown reward {name!r}; choose one of {sorted(REWARDS)}")
        return name


class RewardsConfig(Strict):
    """The reward terms and the error policy."""

    terms: list[RewardTerm] = Field(min_length=1)
    """Rewards summed (weighted) into each sample's total."""
    on_error: Literal["zero", "fail"] = "zero"
    """A reward that raises on a sample: "zero" logs the error and scores that sample 0; "fail" fails the step."""

    @model_validator(mode="after")
    def _check_terms(self) -> RewardsConfig:
        names = [term.name for term in self.terms]
        for name in set(names):
            if names.count(name) > 1:
                raise ValueError(f"reward {name!r} appears {names.count(name)} times in terms; merge them into one")
        for index, term in enumerate(self.terms):
            build_reward(term.name, term.params, f"rewards.terms[{index}]")
        return self
