"""DataConfig: which task the prompts come from (a generator, GSM8K, or the user's own data file), how they are
rendered, how many there are."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.strict import Strict


class DataConfig(Strict):
    """Which task the prompts come from, how they are rendered and how many there are."""

    task: Literal["countdown", "math", "gsm8k", "dataset"] = "countdown"
    """countdown: generated puzzles; math: generated word problems; gsm8k: a local GSM8K JSONL file; dataset: your
    own rows from `data.path` (docs/your_own_task.md)."""
    template: Literal["chat", "base"] = "chat"
    """chat: system + user messages for a chat template; base: TinyZero's plain-text prefix ending in `<think>`."""
    assistant_prefix: str = ""
    """Chat only: text the assistant's turn starts with (e.g. "<think>\n"), as TinyZero's base template does, so a
    small model starts on the format's track. The rewards score the prefix and the completion together, as the
    reader of the turn sees it."""
    system_prompt: str | None = None
    """Chat only: the system message (None: templates.SYSTEM_PROMPT, think then answer in tags; for `dataset` rows,
    no system message beyond the row's own). A task whose answer is the completion itself (e.g. countdown
    `answer_tag: null` with `stop: ["\\n"]`) says so here."""
    seed: int = 0
    """Seeds the generators; same config, same prompts."""
    train_size: int | None = Field(None, ge=1)
    """Train prompts (None: 10000 generated puzzles or problems; every train row of a file). For gsm8k and dataset:
    at most this many rows, in file order."""
    eval_size: int = Field(200, ge=0)
    """Eval prompts (for gsm8k without gsm8k_eval_path: held out from the end of gsm8k_path; for dataset: at most
    this many of the held-out rows, in an order drawn from data.seed)."""
    path: str | None = None
    """dataset: the rows, one prompt each: a JSON Lines file (.jsonl, .ndjson, .json), a Parquet file (.parquet), or
    a folder written by Hugging Face `datasets` `save_to_disk` (one split). Read lazily, row by row: a file larger
    than memory is fine. Every column other than the prompt reaches the rewards under its own name."""
    eval_path: str | None = None
    """dataset: a separate held-out file in one of the same formats (e.g. test.jsonl); train then uses all of path."""
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """dataset without eval_path: hold out about this fraction of path's rows (chosen by a fixed hash of the row's
    position, the same for every data.seed, so an eval with another seed never draws training rows)."""
    prompt_field: str = Field("prompt", min_length=1)
    """dataset: the column holding the prompt: text (rendered with data.template) or chat messages (a list of
    {role, content}, as TRL's conversational format)."""
    messages_field: str = Field("messages", min_length=1)
    """dataset: the column read as chat messages when a row has no prompt_field column."""
    parquet_cache_mb: int = Field(256, ge=1)
    """dataset, Parquet only: decoded row groups kept in memory (least recently used first out). A row outside them
    costs a read of its row group; write files with row groups well under this size."""
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
        if self.task == "dataset" and not self.path:
            raise ValueError("data.path is required when task is 'dataset': point it at a JSONL or Parquet file or a "
                             "save_to_disk folder")
        if self.eval_path and self.eval_fraction:
            raise ValueError(f"data.eval_path and data.eval_fraction ({self.eval_fraction}) both hold out rows; "
                             "set one of them")
        return self
