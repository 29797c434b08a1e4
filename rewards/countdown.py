"""Countdown reward: does the equation in `<answer>` use each given number once and hit the target?

Semantics follow TinyZero's `countdown.compute_score` (github.com/Jiayi-Pan/TinyZero): 0.0 without an answer block;
otherwise the last block is judged, and a well-formed attempt that fails earns a small format score (0.1) so that a
fresh model first learns to answer at all. Unlike TinyZero nothing is `eval`ed (see `rewards.arithmetic`), and the
completion is scored as is (TinyZero first cut at "Assistant:", because its input included the prompt).

TinyZero also pays the format score for an answer that is not an equation at all (`<answer>(*****)</answer>`): a
small model finds that block in a few steps and stays there, every sample scoring the same, so GRPO sees no
advantage left. `unreadable_score` (default: TinyZero's, the format score) lets a config pay such answers less.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

from rewards import arithmetic
from rewards.tags import last_block
from rewards.types import Sample

FORMAT_SCORE = 0.1
CORRECT_SCORE = 1.0
TOLERANCE = 1e-5


def score(
    completion: str,
    numbers: Sequence[int],
    target: int,
    format_score: float = FORMAT_SCORE,
    correct_score: float = CORRECT_SCORE,
    answer_tag: str | None = "answer",
    unreadable_score: float | None = None,
    equals_target: bool = False,
) -> float:
    """0.0 without `<answer>` (answer_tag None: the completion is the answer); `correct_score` for a correct
    equation; `format_score` for a wrong or misusing one; `unreadable_score` (None: `format_score`) for an answer
    that does not parse as an equation. With `equals_target`, `EXPR = TARGET` (either side) is judged as EXPR; any
    other `=` is not part of the grammar."""
    if not all(type(n) is int for n in numbers):
        # Would otherwise score every answer 0.1 silently (e.g. numbers read from JSON as strings).
        raise ValueError(f"reference numbers must be ints, got {list(numbers)!r}; fix the dataset")
    equation = completion if answer_tag is None else last_block(completion, answer_tag)
    if equation is None:
        return 0.0
    if equals_target:
        equation = _drop_target_side(equation, target)
    try:
        tree = arithmetic.parse(equation.strip())
    except arithmetic.ExpressionError:
        return format_score if unreadable_score is None else unreadable_score
    if sorted(arithmetic.literals(tree)) != sorted(numbers):
        return format_score
    try:
        value = arithmetic.evaluate(tree)
    except arithmetic.ExpressionError:  # division by zero, oversized values
        return format_score
    return correct_score if abs(value - target) < TOLERANCE else format_score


def _drop_target_side(equation: str, target: int) -> str:
    """`EXPR = TARGET` or `TARGET = EXPR` -> EXPR; anything else unchanged (and judged as it is)."""
    sides = [side.strip().removesuffix(".").strip() for side in equation.split("=")]  # "2 + 5 = 7." ends a sentence
    if len(sides) == 2 and str(target) in sides:
        return sides[1] if sides[0] == str(target) else sides[0]
    return equation


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class CountdownReward:
    """`score` as a RewardFn; reads `numbers` and `target` from the sample's reference."""

    __name__: ClassVar[str] = "countdown"
    format_score: float = Field(FORMAT_SCORE, ge=0.0, le=1.0)
    """Score of a completion that has an answer block but not a correct equation."""
    unreadable_score: float | None = Field(None, ge=0.0, le=1.0)
    """Score of an answer block that is not an equation (empty, prose, `(*****)`); None = `format_score` (TinyZero)."""
    correct_score: float = Field(CORRECT_SCORE, ge=0.0)
    """Score of a correct equation."""
    answer_tag: str | None = Field("answer", min_length=1, pattern=r"^[A-Za-z_][\w-]*$")
    """Tag name of the answer block (`<answer>...</answer>`); None: the whole completion is the answer (a model
    too small to write tags, its line ended by `rollout.sampling.stop: ["\\n"]`)."""
    equals_target: bool = False
    """Also accept `EXPR = TARGET` (the prompt asks for an equation; small models write it so). Off: TinyZero's
    grammar, where `=` makes the answer unreadable. Nothing is gained by it: EXPR is still judged in full."""

    def __call__(self, sample: Sample) -> float:
        ref = sample.reference
        return score(
            sample.completion, ref["numbers"], ref["target"], self.format_score, self.correct_score, self.answer_tag,
            self.unreadable_score, self.equals_target,
        )
