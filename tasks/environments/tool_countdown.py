"""Tool-using Countdown: the model may check its arithmetic with a calculator tool before it answers.

Rows are `data.task: countdown`'s puzzles. Each model turn either calls the calculator (the environment answers with
the value, or with the error: the expression is parsed by `common.arithmetic`, never `eval`ed, so `9**9**9` or a
name is an error message, not a computation), or gives the final answer, which ends the episode and is scored as
the Countdown reward scores a single-turn answer: 1.0 for an equation that uses each number once and hits the
target, else 0. With `require_tool_call`, an answer scores only after at least one calculator call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from common.strict import Strict
from common import arithmetic
from common.countdown import score as countdown_score
from tasks.prompt import Prompt
from tasks.environments.base import Message, ModelTurn, Reply
from tasks.environments.tool_calls import Tool, ToolFormat, describe, parse, run_calls, stop_strings
from tasks.templates import COUNTDOWN_USER

INTRO = "You are a helpful assistant who solves arithmetic puzzles."
ANSWER = {
    None: "When you know the answer, reply with one line: the equation, nothing else.",
    "answer": "When you know the answer, write the equation inside <answer> </answer> tags.",
}


def calculate(expression: str) -> str:
    """The exact value of an integer arithmetic expression (+ - * / and parentheses), e.g. "7/3" or "42"."""
    try:
        value = arithmetic.evaluate(arithmetic.parse(expression.strip()))
    except arithmetic.ExpressionError as exc:
        raise ValueError(str(exc)) from None
    return str(value)


CALCULATOR = Tool("calculator", "evaluates an arithmetic expression of integers with + - * / and parentheses",
                  "expression", calculate)


class ToolCountdown(Strict):
    """The environment (its fields are `environment.params`)."""

    tool_format: ToolFormat = "tags"
    """How the model writes a call (tasks/environments/tool_calls.py): `tags` (<calculator>3 + 4</calculator>) or
    `hermes` (<tool_call>{"name": "calculator", ...}</tool_call>)."""
    answer_tag: str | None = Field(None, pattern=r"^answer$")
    """None: the final turn is the equation (one line); "answer": it is inside <answer> tags."""
    require_tool_call: bool = False
    """Score an answer only after at least one calculator call."""

    @property
    def stop(self) -> list[str]:
        return stop_strings([CALCULATOR], self.tool_format)

    def system_prompt(self) -> str:
        return f"{INTRO} {describe([CALCULATOR], self.tool_format)}\n{ANSWER[self.answer_tag]}"

    def episode(self, row: Prompt) -> CountdownEpisode:
        if "numbers" not in row.reference or "target" not in row.reference:
            raise ValueError(f"{row.uid}: tool_countdown needs countdown rows (data.task: countdown), got "
                             f"{sorted(row.reference)}")
        return CountdownEpisode(self, row)


@dataclass
class CountdownEpisode:
    env: ToolCountdown
    row: Prompt
    calls: int = field(default=0)

    def opening(self) -> list[Message]:
        ref = self.row.reference
        user = COUNTDOWN_USER.format(numbers=list(ref["numbers"]), target=ref["target"])
        return [{"role": "system", "content": self.env.system_prompt()}, {"role": "user", "content": user}]

    def step(self, turn: ModelTurn) -> Reply:
        calls = parse(turn.text, [CALCULATOR], self.env.tool_format)
        if calls:
            self.calls += len(calls)
            return Reply(run_calls(calls, [CALCULATOR]), info={"tool_calls": len(calls)})
        if self.env.require_tool_call and self.calls == 0:
            return Reply(done=True, info={"answered_without_tool": 1})
        ref = self.row.reference
        reward = countdown_score(turn.text.strip(), ref["numbers"], ref["target"], format_score=0.0,
                                 answer_tag=self.env.answer_tag, unreadable_score=0.0, equals_target=True)
        return Reply(reward=reward, done=True)
