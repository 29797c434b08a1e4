"""`data.task: dataset`: the user's rows as prompts, split into train and held-out, read lazily.

A split is a list of row positions (8 bytes each), not of rows: `RowPrompts[i]` reads and renders row i when the
stream draws it, so a file larger than memory trains as well as a small one. The training order is the
PromptStream's seeded shuffle; the held-out prompts are ordered by `data.seed`, so `orchestration.cli.eval --seed 1`
draws other held-out rows, never training ones: which rows are held out (`data.eval_fraction`) depends only on a
row's position, through a fixed integer hash, not on the seed.

A row's prompt is its `data.prompt_field` column (or `data.messages_field`): text, or chat messages as a list of
{role, content}. Every other column goes to the rewards as the prompt's reference, under its own name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from tasks.config import DataConfig
from tasks.errors import DataError
from tasks.prompt import Prompt
from tasks.rows import Rows, open_rows

HASH_SALT = 0x5DEECE66D
"""Fixed input of the held-out hash: changing it would move rows between train and eval."""


class RowPrompts(Sequence):
    """The prompts of one split of a data file, rendered from their rows on access."""

    def __init__(self, rows: Rows, positions, cfg: DataConfig, split: str):
        self._rows, self._positions, self._cfg, self._split = rows, positions, cfg, split
        self.fingerprint = f"{rows.fingerprint}:{split}:{len(positions)}"
        """What a stream checkpoint records: resuming against a changed file fails in one line, not silently."""

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = int(self._positions[index])
        where = self._rows.where
        return row_prompt(self._rows.row(position), position, self._split, self._cfg, lambda: where(position))


def dataset_prompts(cfg: DataConfig, split: Literal["train", "eval"]) -> RowPrompts:
    """The split's prompts: train rows in file order, held-out rows in an order drawn from data.seed."""
    import numpy as np

    if split == "eval" and cfg.eval_path:
        rows = open_rows(cfg.eval_path, "data.eval_path", cfg.parquet_cache_mb)
    else:
        rows = open_rows(cfg.path or "", "data.path", cfg.parquet_cache_mb)
    if cfg.eval_path:  # train: all of path; eval: all of eval_path
        positions = np.arange(len(rows), dtype=np.int64)
    else:
        held_out = is_held_out(len(rows), cfg.eval_fraction)
        positions = np.flatnonzero(held_out if split == "eval" else ~held_out).astype(np.int64)
    if split == "eval":
        positions = np.random.default_rng([cfg.seed, 1]).permutation(positions)[: cfg.eval_size]
    elif cfg.train_size is not None:
        positions = positions[: cfg.train_size]
    if split == "train" and not len(positions):
        raise DataError(f"data.path {cfg.path}: no training rows left (data.eval_fraction {cfg.eval_fraction} of "
                        f"{len(rows)} rows held out); lower data.eval_fraction")
    check_first_row(rows, cfg)
    return RowPrompts(rows, positions, cfg, split)


def is_held_out(count: int, fraction: float):
    """Boolean mask over positions 0..count-1: about `fraction` of them held out, by a fixed hash of the position."""
    import numpy as np

    x = np.arange(count, dtype=np.uint64) + np.uint64(HASH_SALT)
    # splitmix64's finaliser: consecutive positions land in unrelated buckets (uint64 arithmetic wraps on purpose).
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction


def check_first_row(rows: Rows, cfg: DataConfig) -> None:
    """Render the first row now, so a wrong prompt_field or template fails before any cluster starts."""
    row_prompt(rows.row(0), 0, "check", cfg, lambda: rows.where(0))


def row_prompt(row: dict[str, Any], position: int, split: str, cfg: DataConfig, where) -> Any:
    """The Prompt of one row; `where()` names it in errors."""
    field = cfg.prompt_field if cfg.prompt_field in row else cfg.messages_field
    if field not in row:
        raise DataError(f"{where()}: no {cfg.prompt_field!r} or {cfg.messages_field!r} column (columns: "
                        f"{sorted(row)[:10]}); set data.prompt_field to the column that holds the prompt")
    value = row[field]
    reference = {key: v for key, v in row.items() if key != field}
    system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    if isinstance(value, str):
        if cfg.template == "base":
            return Prompt(f"dataset-{split}-{position:06d}", "dataset", None, value, reference, raw=value)
        messages = [*system, {"role": "user", "content": value}]
    else:
        messages = chat_messages(value, field, where)
        if cfg.template == "base":
            raise DataError(f"{where()}: column {field!r} holds chat messages but data.template is base; set "
                            "data.template: chat (the model's chat template renders them)")
        if system and messages[0]["role"] != "system":
            messages = [*system, *messages]
    return Prompt(f"dataset-{split}-{position:06d}", "dataset", tuple(messages), None, reference, raw=value)


def chat_messages(value: Any, field: str, where) -> list[dict[str, Any]]:
    """A row's messages, checked; keys whose value is None are dropped (Arrow structs fill absent keys with None)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where()}: column {field!r} must be text or a non-empty list of chat messages, got "
                        f"{type(value).__name__}")
    messages = []
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            raise DataError(f"{where()}: column {field!r}: each message needs a role and a content, got "
                            f"{str(message)[:80]}")
        messages.append({key: v for key, v in message.items() if v is not None})
    if messages[-1]["role"] == "assistant":
        raise DataError(f"{where()}: the messages end with an assistant turn, so the answer would be in the prompt; "
                        "end them with the user's turn and put the answer in its own column (e.g. answer)")
    return messages
