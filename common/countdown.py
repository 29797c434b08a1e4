"""The Countdown rule: does an equation use each given number once and hit the target? (the problem's definition)

The reward (rewards/countdown.py) and the tool-using Countdown environment (tasks/environments/tool_countdown.py)
both judge answers by it, so it sits on the ground floor. Semantics follow TinyZero's `countdown.compute_score`
(github.com/Jiayi-Pan/TinyZero): 0.0 without an answer block; otherwise the last block is judged, and a well-formed
attempt that fails earns a small format score. Nothing is `eval`ed: the equation is parsed by `common.arithmetic`.
"""

from __future__ import annotations

from collections.abc import Sequence

from common import arithmetic
from common.tags import last_block

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
