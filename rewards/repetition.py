"""Repetition penalty: a negative reward for completions that loop on the same word n-grams.

Small models under RL often collapse into repeating a phrase until `max_tokens`; the length then dominates the
step time. The ratio is 1 - unique n-grams / all n-grams over lower-cased whitespace-separated words (as in
open-r1's `get_repetition_penalty_reward`), mapped to a penalty by thresholds (tiers) instead of linearly, so
ordinary prose that repeats a phrase or two is not punished.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from common.strict import STRICT

from rewards.types import Sample

DEFAULT_TIERS = ((0.3, -3.0), (0.2, -1.5), (0.1, -0.5))


def repeated_ratio(completion: str, ngram: int = 4) -> float:
    """Fraction of the completion's word n-grams that repeat an earlier one; 0.0 with fewer than `ngram` words."""
    words = completion.lower().split()
    total = len(words) - ngram + 1
    if total <= 0:
        return 0.0
    unique = len(set(zip(*(words[i:] for i in range(ngram)))))
    return 1.0 - unique / total


def score(completion: str, ngram: int = 4, tiers: tuple[tuple[float, float], ...] = DEFAULT_TIERS) -> float:
    """Penalty of the first tier (highest threshold first) that the repeated n-gram ratio exceeds; else 0.0."""
    ratio = repeated_ratio(completion, ngram)
    for threshold, penalty in sorted(tiers, reverse=True):
        if ratio > threshold:
            return penalty
    return 0.0


@dataclass(config=STRICT)  # frozen by STRICT
class RepetitionPenalty:
    """Penalty of the first tier whose threshold the repeated n-gram ratio exceeds; 0.0 below all of them."""

    __name__: ClassVar[str] = "repetition"
    ngram: int = Field(4, ge=1, le=64)
    """Words per n-gram."""
    tiers: tuple[tuple[float, float], ...] = DEFAULT_TIERS
    """(ratio threshold, penalty) pairs; checked from the highest threshold down."""

    @field_validator("tiers")
    @classmethod
    def _check_tiers(cls, tiers: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        for threshold, penalty in tiers:
            if not 0.0 <= threshold < 1.0 or penalty > 0.0:
                raise ValueError(f"tier ({threshold}, {penalty}) needs 0 <= threshold < 1 and penalty <= 0")
        return tuple(sorted(tiers, reverse=True))

    def __call__(self, sample: Sample) -> float:
        return score(sample.completion, self.ngram, self.tiers)

    @property
    def min_value(self) -> float:
        """Most negative value this penalty can return."""
        return min((penalty for _, penalty in self.tiers), default=0.0)
