"""Prompt records of one split, drawn deterministically; train and eval are split by a hash of the content."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal

from tasks.config import DataConfig
from tasks.errors import DatasetTooSmall
from tasks.generators import countdown_puzzle, word_problem
from tasks.gsm8k import gsm8k_rows
from tasks.prompt import Prompt
from tasks.row_prompts import dataset_prompts
from tasks.templates import COUNTDOWN_USER, MATH_USER, render

EVAL_BUCKETS = 10
"""One content hash bucket in this many belongs to eval; the rest to train."""
GENERATED_TRAIN_SIZE = 10000
"""Train puzzles or problems a generator makes when data.train_size is not set."""


def setup_dataset(cfg: DataConfig, split: Literal["train", "eval"]) -> Sequence[Prompt]:
    """The prompts of one split; deterministic given cfg. A dataset file's prompts are read lazily (RowPrompts)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if cfg.task == "dataset":
        return dataset_prompts(cfg, split)
    size = (cfg.train_size or GENERATED_TRAIN_SIZE) if split == "train" else cfg.eval_size
    if cfg.task == "gsm8k":
        task, rows = "math", gsm8k_rows(cfg, split)[: cfg.train_size if split == "train" else size]
    elif cfg.task == "math":
        task, rows = "math", draw(word_problem, cfg, split, size, key=lambda r: r[0])
    else:
        task = "countdown"
        rows = draw(lambda rng: countdown_puzzle(rng, cfg), cfg, split, size, key=lambda r: (sorted(r[0]), r[1]))
    prompts = []
    for index, row in enumerate(rows):
        if task == "countdown":
            numbers, target, solution = row
            user = COUNTDOWN_USER.format(numbers=list(numbers), target=target)
            reference: dict[str, Any] = {"numbers": list(numbers), "target": target, "solution": solution}
        else:
            user, reference = MATH_USER.format(question=row[0]), {"answer": row[1]}
        messages, text = render(user, cfg.template, cfg.system_prompt)
        prompts.append(Prompt(f"{task}-{split}-{index:06d}", task, messages, text, reference))
    return prompts


def draw(make: Callable[[random.Random], Any], cfg: DataConfig, split: str, size: int, key: Callable) -> list:
    """`size` distinct items of this split's hash bucket, drawn from a generator seeded by (seed, split)."""
    rng = random.Random(f"{cfg.task}-{cfg.seed}-{split}")
    items, seen = [], set()
    budget = 50 * size + 10_000
    for _ in range(budget):
        if len(items) == size:
            break
        item = make(rng)
        if item is None:
            continue
        content = repr(key(item))
        if content in seen or is_eval(content) != (split == "eval"):
            continue
        seen.add(content)
        items.append(item)
    if len(items) < size:
        raise DatasetTooSmall(
            f"data.{split}_size={size}, but only {len(items)} distinct {cfg.task} {split} items came from {budget} "
            f"draws: set data.{split}_size to at most {len(items)} or widen the generator (data.max_number, "
            "data.max_target)"
        )
    return items


def is_eval(content: str) -> bool:
    # A content hash, not hash(): Python salts str hashes per process, which would reshuffle the splits.
    return hashlib.blake2b(content.encode(), digest_size=8).digest()[0] % EVAL_BUCKETS == 0
