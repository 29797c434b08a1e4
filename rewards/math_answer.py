"""Math reward: 1.0 when the completion's final answer equals the reference number, else 0.0.

The final answer is the last `\\boxed{...}`, else the last `<answer>...</answer>`, else the text after the last `####`
(GSM8K's marker). Both sides are normalised (commas, `$`, `%`, spaces and LaTeX spacing dropped, `\\text{...}` units
removed) and compared as exact fractions, so `42.0` equals `42` and `1/2` equals `0.5` but `0.33` does not equal `1/3`.
Numbers are parsed with a small pattern, never `float()` on raw text (which accepts "1e999999", "nan" and "inf").
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import ClassVar

from pydantic import Field
from pydantic.dataclasses import dataclass

from common.strict import STRICT

from common.tags import last_block
from rewards.types import Sample

MAX_ANSWER_CHARS = 100
"""Longer final answers are not numbers a grader should try to read."""

_BOXED = "\\boxed{"
_NUMBER = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_FULL = re.compile(rf"({_NUMBER})(?:/({_NUMBER}))?")
_FRAC = re.compile(rf"\\[dt]?frac\{{({_NUMBER})\}}\{{({_NUMBER})\}}")
_LEADING = re.compile(rf"{_NUMBER}(?:/[0-9]+)?")
_TEXT = re.compile(r"\\(?:text|mathrm|mbox)\{[^{}]*\}")
_LATEX_DROP = ("\\!", "\\,", "\\;", "\\$", "\\%")  # LaTeX spacing and escaped $ / %
_DROP = str.maketrans("", "", ",$% \t\r\n")


def score(completion: str, answer: str, answer_tag: str = "answer") -> float:
    """1.0 when the completion's final answer equals `answer` numerically, else 0.0; raises if `answer` is no number."""
    reference = parse_number(answer.rsplit("####", 1)[-1], lenient=True)
    if reference is None:
        raise ValueError(f"reference answer {answer[:80]!r} is not a number; fix the dataset's answer field")
    text, lenient = final_answer(completion, answer_tag)
    if text is None:
        return 0.0
    return 1.0 if parse_number(text, lenient) == reference else 0.0


def final_answer(completion: str, answer_tag: str = "answer") -> tuple[str | None, bool]:
    """(answer text, lenient): last boxed, else last answer block, else text after `####` (lenient: may trail words)."""
    boxed = _last_boxed(completion)
    if boxed is not None:
        return boxed, False
    block = last_block(completion, answer_tag)
    if block is not None:
        return block, False
    at = completion.rfind("####")
    if at >= 0:
        # Only its first line: GSM8K-style text runs on after the number ("#### 72\n\nUser: ...").
        return completion[at + 4 : at + 4 + MAX_ANSWER_CHARS].lstrip().split("\n", 1)[0], True
    return None, False


def parse_number(text: str, lenient: bool = False) -> Fraction | None:
    """Exact value of a normalised answer ("1,234", "$5", "50%", "1/2", "\\frac{1}{2}", "-3.5"); None if not one.

    `lenient` reads a leading number and ignores what follows ("72 apples."), as text after `####` usually runs on.
    """
    if len(text) > MAX_ANSWER_CHARS:
        return None
    flat = _TEXT.sub("", text).replace("\u2212", "-")
    for latex in _LATEX_DROP:
        flat = flat.replace(latex, "")
    flat = flat.translate(_DROP)
    flat = flat.removeprefix("\\(").removesuffix("\\)")
    if flat.startswith("{") and flat.endswith("}"):
        flat = flat[1:-1]
    if match := _FRAC.fullmatch(flat):
        return _ratio(match[1], match[2])
    if match := _FULL.fullmatch(flat.rstrip(".")):
        return _ratio(match[1], match[2])
    if lenient and (match := _LEADING.match(flat)):
        num, _, den = match[0].rstrip(".").partition("/")
        return _ratio(num, den or None)
    return None


def _ratio(num: str, den: str | None) -> Fraction | None:
    value = Fraction(num)
    if den is None:
        return value
    divisor = Fraction(den)
    return value / divisor if divisor else None


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, braces balanced; None if absent or never closed."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(_BOXED)
    # Bounded scan: an answer longer than MAX_ANSWER_CHARS is rejected anyway.
    for i in range(begin, min(len(text), begin + MAX_ANSWER_CHARS + 1)):
        char = text[i]
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return text[begin:i]
    return None


@dataclass(config=STRICT)  # frozen by STRICT
class MathAnswerReward:
    """`score` as a RewardFn; reads `answer` from the sample's reference."""

    __name__: ClassVar[str] = "math_answer"
    answer_tag: str = Field("answer", min_length=1, pattern=r"^[A-Za-z_][\w-]*$")
    """Tag name of the answer block; keep it equal to the format reward's `answer_tag`."""

    def __call__(self, sample: Sample) -> float:
        return score(sample.completion, str(sample.reference["answer"]), self.answer_tag)
