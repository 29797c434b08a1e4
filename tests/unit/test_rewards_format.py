"""format reward: 1.0 for think-then-answer, 0.5 for an answer block alone, 0.0 otherwise."""

from __future__ import annotations

import pytest

from rewards.format import FormatReward, score
from rewards.types import Sample


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("", 0.0),
        ("just text", 0.0),
        ("<think>a</think>", 0.0),
        ("<think>a</think><answer></answer>", 0.0),  # empty answer is no answer
        ("<think>a</think><answer>  \n</answer>", 0.0),
        ("<think>a</think><answer>b</answer>", 1.0),
        ("<think>\nreason\n</think>\n<answer>\n7\n</answer>\n", 1.0),
        ("  <think>a</think>  <answer>b</answer>  ", 1.0),
        ("reasoning started in the prompt</think>\n<answer>b</answer>", 1.0),  # base template opens <think>
        ("<answer>b</answer>", 0.5),
        ("<think></think><answer>b</answer>", 0.5),  # no thinking
        ("<think>a</think> words <answer>b</answer>", 0.5),
        ("<think>a</think><answer>b</answer> trailing", 0.5),
        ("intro <think>a</think><answer>b</answer>", 0.5),
        ("<answer>b</answer><think>a</think>", 0.5),  # wrong order
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.5),  # two answers
        ("<think>a<think>b</think><answer>c</answer>", 0.5),
        ("<think>a</think></think><answer>c</answer>", 0.5),
        ("<think>a</think><answer>b", 0.0),
        ("<think>思考 🤔</think><answer>答え</answer>", 1.0),
    ],
)
def test_score_cases(completion: str, expected: float) -> None:
    assert score(completion) == expected


def test_configurable_tags() -> None:
    fn = FormatReward(think_tag="reasoning", answer_tag="final")
    assert fn.__name__ == "format"
    assert fn(Sample("p", "<reasoning>r</reasoning><final>f</final>", {})) == 1.0
    assert fn(Sample("p", "<think>r</think><answer>f</answer>", {})) == 0.0


def test_bad_tag_is_rejected() -> None:
    with pytest.raises(ValueError, match="think_tag"):
        FormatReward(think_tag="<think>")
