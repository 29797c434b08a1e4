"""math_answer edge cases: which answer is final, normalisation, exact numeric comparison."""

from __future__ import annotations

import pytest

from rewards.math_answer import MathAnswerReward, parse_number, score
from rewards.types import Sample


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("", "42", 0.0),
        ("The answer is 42", "42", 0.0),  # no marker: nothing is final
        ("\\boxed{42}", "42", 1.0),
        ("\\boxed{42.0}", "42", 1.0),
        ("\\boxed{42.}", "42", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "1/2", 1.0),
        ("\\boxed{1/2}", "0.5", 1.0),
        ("\\boxed{0.33}", "1/3", 0.0),  # exact comparison, no tolerance
        ("\\boxed{\\$1,234}", "1234", 1.0),
        ("\\boxed{50\\%}", "50", 1.0),
        ("\\boxed{12 \\text{ apples}}", "12", 1.0),
        ("\\boxed{-7}", "-7", 1.0),
        ("\\boxed{\u22127}", "-7", 1.0),  # unicode minus
        ("\\boxed{7}", "-7", 0.0),
        ("\\boxed{1} then \\boxed{2}", "2", 1.0),  # last boxed wins
        ("\\boxed{1} then \\boxed{2}", "1", 0.0),
        ("\\boxed{42", "42", 0.0),  # never closed: no boxed; no other marker
        ("<answer>42</answer>", "42", 1.0),
        ("<answer> $ 4,2 </answer>", "42", 1.0),  # commas, $ and spaces ignored
        ("<answer>41</answer> <answer>42</answer>", "42", 1.0),
        ("\\boxed{41} <answer>42</answer>", "42", 0.0),  # boxed takes precedence
        ("<answer>forty-two</answer>", "42", 0.0),
        ("<answer>42 apples</answer>", "42", 0.0),  # answer blocks must hold just the number
        ("So #### 42", "42", 1.0),
        ("#### 41\n#### 42 apples.\nUser: next", "42", 1.0),  # text after the last ####, leading number
        ("#### 4\n2 apples", "42", 0.0),  # the number ends at the line break
        ("####\n  42\nUser: 7", "42", 1.0),
        ("#### 42", "#### 42", 1.0),  # a raw GSM8K answer string works as the reference too
        ("<answer>1e999999</answer>", "42", 0.0),  # no float() on raw text
        ("<answer>nan</answer>", "42", 0.0),
        ("<answer>inf</answer>", "42", 0.0),
        ("<answer>٤٢</answer>", "42", 0.0),  # other scripts' digits are not read as numbers
        ("<answer>1/0</answer>", "42", 0.0),
        ("<answer>\n 42 \n</answer>", "42", 1.0),
    ],
)
def test_score_cases(completion: str, answer: str, expected: float) -> None:
    assert score(completion, answer) == expected


def test_unreadable_reference_raises_with_fix() -> None:
    with pytest.raises(ValueError, match="reference answer 'many' is not a number"):
        score("<answer>1</answer>", "many")


def test_parse_number_bounds_length() -> None:
    assert parse_number("1" * 101) is None
    assert parse_number("1" * 100) == int("1" * 100)


def test_reward_fn_accepts_the_format_rewards_tag() -> None:
    fn = MathAnswerReward(answer_tag="final")
    assert fn.__name__ == "math_answer"
    assert fn(Sample("q", "<final>72</final>", {"answer": "72"})) == 1.0
    assert fn(Sample("q", "<answer>72</answer>", {"answer": 72})) == 0.0
