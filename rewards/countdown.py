"""Countdown reward: does the equation in `<answer>` use each given number once and hit the target?

Semantics follow TinyZero's `countdown.compute_score` (github.com/Jiayi-Pan/TinyZero): 0.0 without an answer block;
otherwise the last block is judged, and a well-formed attempt that fails earns a small format score (0.1) so that a
fresh model first learns to answer at all. Unlike TinyZero nothing is `eval`ed (see `common.arithmetic`), and the
completion is scored as is (TinyZero first cut at "Assistant:", because its input included the prompt).

TinyZero also pays the format score for an answer that is not an equation at all (`<answer>(*****)</answer>`): a
small model finds that block in a few steps and stays there, every sample scoring the same, so GRPO sees no
advantage left. `unreadable_score` (default: TinyZero's, the format score) lets a config pay such answers less.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic.dataclasses import dataclass

from common.strict import STRICT

from common.countdown import CORRECT_SCORE, FORMAT_SCORE, score
from rewards.types import Sample


@dataclass(config=STRICT)  # frozen by STRICT
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
