"""Countdown reward edge cases: TinyZero's 0 / 0.1 / 1 semantics and the safe evaluator's bounds."""

from __future__ import annotations

import pytest

from common import arithmetic
from rewards.countdown import CountdownReward, score
from rewards.types import Sample

NUMS = [3, 7, 25]  # 25 + 3 * 7 = 46; (25 - 7) / 3 = 6


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("", 0.0),
        ("25 + 3 * 7", 0.0),  # no tags: nothing to judge
        ("<answer>25 + 3 * 7", 0.0),  # never closed
        ("</answer>25 + 3 * 7<answer>", 0.0),  # tags in the wrong order
        ("<think>x</think><answer>25 + 3 * 7</answer>", 1.0),
        ("<answer>\n  25 + 3 * 7 \t\n</answer>", 1.0),  # whitespace and newlines inside the block
        ("<answer>25+3*7</answer>", 1.0),
        ("<answer>(25 - 7) / 3 * 7 + 4</answer>", 0.1),  # 4 is not given
        ("<answer>25 + 3 * 7 * 3</answer>", 0.1),  # 3 used twice
        ("<answer>25 + 21</answer>", 0.1),  # 3 and 7 missing
        ("<answer>25 + 3 + 7</answer>", 0.1),  # valid numbers, wrong value
        ("<answer>25 + 3 * 7 = 46</answer>", 0.1),  # '=' is not part of the grammar (TinyZero: format score)
        ("<answer></answer>", 0.1),
        ("<answer>1</answer> then <answer>25 + 3 * 7</answer>", 1.0),  # the last block counts
        ("<answer>25 + 3 * 7</answer> no, <answer>25 + 3 + 7</answer>", 0.1),
        ("<answer>25 + 3 * 7</answer> </answer>", 1.0),  # stray closing tag after the block
        ("<answer>x <answer>25 + 3 * 7</answer>", 1.0),  # unclosed earlier block: the closed one counts
    ],
)
def test_score_cases(completion: str, expected: float) -> None:
    assert score(completion, NUMS, 46) == expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>25 + 3 * 7 = 46</answer>", 1.0),
        ("<answer>46 = 25 + 3 * 7</answer>", 1.0),
        ("<answer>25 + 3 + 7 = 46</answer>", 0.1),  # the expression is still judged: 35
        ("<answer>25 + 3 * 7 = 45</answer>", 0.0),  # not the target: `=` stays, unreadable
        ("<answer>25 + 3 * 7 = 46 = 46</answer>", 0.0),
        ("<answer>46 = 46</answer>", 0.1),  # the bare target uses none of the numbers
        ("<answer>25 + 3 * 7</answer>", 1.0),
    ],
)
def test_equals_target_judges_the_expression_side(completion: str, expected: float) -> None:
    assert score(completion, NUMS, 46, unreadable_score=0.0, equals_target=True) == expected
    assert CountdownReward(unreadable_score=0.0, equals_target=True)(Sample("p", completion, {"numbers": NUMS,
                                                                                               "target": 46})) == expected


def test_division_is_exact() -> None:
    assert score("<answer>(25 - 7) / 3</answer>", NUMS, 6) == 1.0
    # 1/3 * 3 is exactly 1 with fractions; a float evaluator could miss by 1e-16 (still inside the tolerance).
    assert score("<answer>(1 / 3) * 3 + 2</answer>", [1, 3, 3, 2], 3) == 1.0
    assert score("<answer>7 / 2 + 25 + 3</answer>", NUMS, 31) == 0.1  # 31.5, not 31


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>(*****)</answer>", 0.0),  # the block a small policy collapses to: not an equation
        ("<answer>the answer is 46</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("<answer>25 + 3 + 7</answer>", 0.1),  # an equation, wrong value: still the format score
        ("<answer>25 + 21</answer>", 0.1),  # an equation with the wrong numbers: format score
        ("<answer>25 + 3 * 7</answer>", 1.0),
    ],
)
def test_unreadable_answers_can_score_below_the_format_score(completion: str, expected: float) -> None:
    reward = CountdownReward(unreadable_score=0.0)
    assert reward(Sample(prompt="", completion=completion, reference={"numbers": NUMS, "target": 46})) == expected
    assert score(completion, NUMS, 46) == (0.1 if expected == 0.0 else expected)  # TinyZero's default is unchanged


@pytest.mark.parametrize("expr", ["25 / (7 - 7) + 3", "3 / 0", "(3 + 7 - 10) / 0", "25 / (3 - 3 * 1)"])
def test_division_by_zero_is_format_score(expr: str) -> None:
    nums = arithmetic.literals(arithmetic.parse(expr))
    assert score(f"<answer>{expr}</answer>", nums, 1) == 0.1


@pytest.mark.parametrize(
    "expr",
    [
        "3 ** 7 + 25",  # power
        "25 // 3 + 7",  # floor division
        "25 % 3 + 7",
        "abs(25) + 3 + 7",  # call
        "__import__('os').system('touch pwned')",
        "(3).real + 7 + 25",  # attribute
        "25 + 3.0 * 7",  # not an integer
        "25 + 3e0 * 7",
        "25 + 0x3 * 7",
        "25 + 3_0 * 7",
        "[25, 3, 7]",
        "25 + ３ * 7",  # full-width digit
        "25 + ٣ * 7",  # Arabic-Indic digit
        "25 + 3 × 7",  # multiplication sign
        "25 + 3 * 7;",
        "25 + 3 7",  # two numbers in a row
        "25 + (3 * 7",  # unbalanced
        "25 + 3 * 7)",
        "",
        "25 + 03 * 7",  # leading zero
        "(" * 100 + "25 + 3 * 7" + ")" * 100,  # longer than the expression bound
        "-" * 60 + "25 + 3 * 7",  # deep unary chain (-(-(...)))
        "25 + 3 * 7" + " + 0" * 60,  # longer than the expression bound
    ],
)
def test_rejected_expressions_get_format_score(expr: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert score(f"<answer>{expr}</answer>", NUMS, 46) == 0.1
    assert list(tmp_path.iterdir()) == [], "scoring created a file: model text was executed"


def test_parentheses_count_towards_the_depth_limit() -> None:
    assert score("<answer>" + "(" * 20 + "25 + 3 * 7" + ")" * 20 + "</answer>", NUMS, 46) == 1.0
    assert score("<answer>" + "(" * 60 + "25 + 3 * 7" + ")" * 60 + "</answer>", NUMS, 46) == 0.1


def test_unary_minus_is_allowed_like_tinyzero() -> None:
    assert score("<answer>-(3 - 25) * 7 - 108</answer>", [3, 25, 7, 108], 46) == 1.0


def test_magnitude_is_bounded() -> None:
    big = [999_999_999] * 6
    expr = " * ".join(map(str, big))
    assert score(f"<answer>{expr}</answer>", big, 1) == 0.1


def test_unicode_and_noise_around_the_block() -> None:
    text = "🤔 ünïcödé\u200b <think>试试 25+21</think>\r\n<answer>25 + 3 * 7</answer> ✅"
    assert score(text, NUMS, 46) == 1.0


def test_reward_fn_reads_reference_and_params() -> None:
    fn = CountdownReward(format_score=0.0, correct_score=2.0, answer_tag="eq")
    assert fn.__name__ == "countdown"
    assert fn(Sample("p", "<eq>25 + 3 * 7</eq>", {"numbers": NUMS, "target": 46})) == 2.0
    assert fn(Sample("p", "<eq>25 + 3</eq>", {"numbers": NUMS, "target": 46})) == 0.0
    assert fn(Sample("p", "<answer>25 + 3 * 7</answer>", {"numbers": NUMS, "target": 46})) == 0.0


def test_malformed_reference_raises_instead_of_scoring_silently() -> None:
    with pytest.raises(ValueError, match="reference numbers must be ints"):
        score("<answer>25 + 3 * 7</answer>", ["3", "7", "25"], 46)


@pytest.mark.parametrize(
    "completion, expected",
    [
        (" 25 + 3 * 7", 1.0),
        ("25 + 3 * 7 = 46.", 1.0),  # a sentence's full stop after the target
        ("The equation is 25 + 3 * 7", 0.0),  # prose is not an equation
        ("<answer>25 + 3 * 7</answer>", 0.0),  # tags are not part of the grammar either
        ("", 0.0),
        ("25 + 3 + 7", 0.1),
    ],
)
def test_without_an_answer_tag_the_completion_is_the_answer(completion: str, expected: float) -> None:
    reward = CountdownReward(answer_tag=None, equals_target=True, unreadable_score=0.0)
    assert reward(Sample("p", completion, {"numbers": NUMS, "target": 46})) == expected
