"""The real GSM8K from a local JSONL file (nothing is downloaded): rows of (question, final answer) per split."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.config import DataConfig


def gsm8k_rows(cfg: DataConfig, split: str) -> list[tuple[str, str]]:
    """(question, final answer) rows of the split; eval is gsm8k_eval_path or the tail of gsm8k_path."""
    if split == "eval" and cfg.gsm8k_eval_path:
        return read_gsm8k(Path(cfg.gsm8k_eval_path))
    rows = read_gsm8k(Path(cfg.gsm8k_path or ""))
    if cfg.gsm8k_eval_path:
        return rows
    if cfg.eval_size >= len(rows):
        raise ValueError(f"data.eval_size ({cfg.eval_size}) leaves no train rows of {len(rows)} in {cfg.gsm8k_path}")
    cut = len(rows) - cfg.eval_size
    return rows[cut:] if split == "eval" else rows[:cut]


def read_gsm8k(path: Path) -> list[tuple[str, str]]:
    """Parse GSM8K JSONL: each line {"question": str, "answer": "...#### 72"}; errors name the line."""
    if not path.is_file():
        raise ValueError(f"GSM8K file {path} not found; set data.gsm8k_path to a local JSONL (nothing is downloaded)")
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                question, answer = record["question"], record["answer"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: expected a JSON object with question/answer ({exc!r})") from None
            if "####" not in answer:
                raise ValueError(f"{path}:{number}: answer has no '#### N' final answer: {answer[-80:]!r}")
            rows.append((question.strip(), answer.rsplit("####", 1)[1].strip().replace(",", "")))
    if not rows:
        raise ValueError(f"GSM8K file {path} has no rows")
    return rows
