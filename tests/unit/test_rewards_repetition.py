"""repetition penalty: ratio of repeated word n-grams mapped to tiers; picklable with its parameters."""

from __future__ import annotations

import pickle

import pytest

from rewards.repetition import RepetitionPenalty, repeated_ratio, score
from rewards.types import Sample


def test_ratio_hand_computed() -> None:
    assert repeated_ratio("a b c d a b c d", 4) == pytest.approx(1 - 4 / 5)  # 5 4-grams, 4 distinct
    assert repeated_ratio("A b C d a B c D", 4) == pytest.approx(0.2)  # case-insensitive
    assert repeated_ratio("one two three", 4) == 0.0  # shorter than one n-gram
    assert repeated_ratio("", 4) == 0.0
    assert repeated_ratio("x x x x x", 1) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", 0.0),
        ("   \n\t ", 0.0),
        ("the quick brown fox jumps over the lazy dog", 0.0),
        ("I think so. " * 40, -3.0),
        ("répète ça 🤖 " * 30, -3.0),
    ],
)
def test_default_tiers(text: str, expected: float) -> None:
    assert score(text) == expected


def test_tiers_map_ratios() -> None:
    words = [f"w{i}" for i in range(100)]
    for repeats, expected in [(15, -0.5), (25, -1.5), (35, -3.0)]:
        text = " ".join(words[: 100 - repeats] + words[:repeats])  # `repeats - 3` repeated 4-grams out of 97
        assert score(text) == expected, (repeats, repeated_ratio(text))


def test_class_params_pickle_and_validate() -> None:
    fn = RepetitionPenalty(ngram=2, tiers=[(0.5, -1.0)])
    assert fn.__name__ == "repetition" and fn.min_value == -1.0
    clone = pickle.loads(pickle.dumps(fn))
    assert clone == fn
    sample = Sample("p", "a b a b a b a b", {})
    assert clone(sample) == fn(sample) == -1.0
    with pytest.raises(ValueError, match="penalty <= 0"):
        RepetitionPenalty(tiers=[(0.2, 1.0)])
    with pytest.raises(ValueError, match="ngram"):
        RepetitionPenalty(ngram=0)
