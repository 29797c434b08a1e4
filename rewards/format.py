"""Format reward: is the completion `<think>...</think>` then `<answer>...</answer>`, and nothing else?

Partial credit gives a small model a gradient to climb before it ever gets the structure fully right:
- 1.0: one closed think block with content, then (only whitespace between) one answer block with content, and
  nothing after it. The opening think tag may be missing, because the base-model template ends the prompt with
  `<think>` (TinyZero), so the completion starts inside the block.
- 0.5: a non-empty answer block somewhere, but not the full structure (text around it, several blocks, no thinking).
- 0.0: no closed, non-empty answer block.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic.dataclasses import dataclass

from common.strict import STRICT

from common.tags import last_block
from rewards.types import Sample

FULL_SCORE = 1.0
ANSWER_ONLY_SCORE = 0.5


def score(completion: str, think_tag: str = "think", answer_tag: str = "answer") -> float:
    """1.0 for the exact think-then-answer structure, 0.5 for a non-empty answer block alone, else 0.0."""
    answer = last_block(completion, answer_tag)
    if answer is None or not answer.strip():
        return 0.0
    return FULL_SCORE if _well_formed(completion.strip(), think_tag, answer_tag) else ANSWER_ONLY_SCORE


def _well_formed(text: str, think_tag: str, answer_tag: str) -> bool:
    open_think, close_think = f"<{think_tag}>", f"</{think_tag}>"
    open_answer, close_answer = f"<{answer_tag}>", f"</{answer_tag}>"
    counts = [text.count(tag) for tag in (open_think, close_think, open_answer, close_answer)]
    if counts[1:] != [1, 1, 1] or counts[0] > 1 or not text.endswith(close_answer):
        return False
    if counts[0] == 1 and not text.startswith(open_think):
        return False
    think_end, answer_start = text.find(close_think), text.find(open_answer)
    thought = text[len(open_think) if counts[0] else 0 : think_end]
    between = text[think_end + len(close_think) : answer_start]
    return think_end < answer_start and not between.strip() and bool(thought.strip())


@dataclass(config=STRICT)  # frozen by STRICT
class FormatReward:
    """`score` as a RewardFn, with configurable tag names."""

    __name__: ClassVar[str] = "format"
    think_tag: str = Field("think", min_length=1, pattern=r"^[A-Za-z_][\w-]*$")
    """Tag name of the reasoning block."""
    answer_tag: str = Field("answer", min_length=1, pattern=r"^[A-Za-z_][\w-]*$")
    """Tag name of the answer block."""

    def __call__(self, sample: Sample) -> float:
        return score(sample.completion, self.think_tag, self.answer_tag)
