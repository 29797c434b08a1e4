"""DataConfig: which task the prompts come from, how they are rendered, how many there are."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from strict_config import Strict


class DataConfig(Strict):
    """Which task the prompts come from, how they are rendered and how many there are."""

    task: Literal["countdown", "math", "gsm8k"] = "countdown"
    """countdown: generated puzzles; math: generated word problems; gsm8k: a local GSM8K JSONL file."""
    template: Literal["chat", "base"] = "chat"
    """chat: system + user messages for a chat template; base: TinyZero's plain-text prefix ending in `<think>`."""
    assistant_prefix: str = ""
    """Chat only: text the assistant's turn starts with (e.g. "<think>\n"), as TinyZero's base template does, so a
    small model starts on the format's track. The rewards score the prefix and the completion together, as the
    reader of the turn sees it."""
    system_prompt: str | None = None
    """Chat only: the system message (None: templates.SYSTEM_PROMPT, think then answer in tags). A task whose
    answer is the completion itself (e.g. countdown `answer_tag: null` with `stop: ["\\n"]`) says so here."""
    seed: int = 0
    """Seeds the generators; same config, same prompts."""
    train_size: int = Field(10000, ge=1)
    """Train prompts (for gsm8k: at most this many, in file order)."""
    eval_size: int = Field(200, ge=0)
    """Eval prompts (for gsm8k without gsm8k_eval_path: held out from the end of gsm8k_path)."""
    gsm8k_path: str | None = None
    """GSM8K JSONL (one {"question", "answer"} object per line); required when task is gsm8k."""
    gsm8k_eval_path: str | None = None
    """Optional separate GSM8K eval file (e.g. test.jsonl)."""
    countdown_numbers: tuple[int, int] = (3, 4)
    """Smallest and largest count of numbers in a Countdown puzzle."""
    max_number: int = Field(100, ge=2, le=10**6)
    """Countdown numbers are drawn from 1..max_number."""
    max_target: int = Field(100, ge=1, le=10**9)
    """Countdown targets lie in 1..max_target."""

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        low, high = self.countdown_numbers
        if not 2 <= low <= high <= 6:
            raise ValueError(f"countdown_numbers {self.countdown_numbers} must satisfy 2 <= min <= max <= 6")
        if self.task == "gsm8k" and not self.gsm8k_path:
            raise ValueError("data.gsm8k_path is required when task is 'gsm8k': point it at a local GSM8K JSONL file")
        return self
