"""Task data: prompts for Countdown and math, with references for the rewards, and a resumable prompt stream.

Everything is made locally and deterministically from the config (nothing is downloaded at run time):
- Countdown: random numbers combined by a random valid expression tree, so every puzzle is solvable and keeps its
  solution; intermediate values stay positive integers, as in the game.
- Math: a few GSM8K-style word-problem templates with exact integer answers, small enough for CPU runs; or the
  real GSM8K JSONL (`question`, `answer` ending in `#### N`) from a local path.
Train and eval never overlap: a puzzle's split is fixed by a hash of its content, not by the order of drawing.
Prompts are kept short because on the CPU demo every prompt token costs rollout time.

Only the standard library and pydantic are imported: the driver and any Ray worker can import this cheaply.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

EVAL_BUCKETS = 10
"""One content hash bucket in this many belongs to eval; the rest to train."""

# No placeholder ("...") and no example answer: SmolLM2-135M copies them verbatim (greedy, the earlier prompt gave
# "The equation is: 1 + 2 = 3" on every held-out puzzle; a GRPO run converged to "...</think><answer>1 + 2</answer>").
SYSTEM_PROMPT = (
    "You are a helpful assistant. Think about the problem inside <think> </think> tags, "
    "then write only the final answer inside <answer> </answer> tags."
)
# TinyZero's base-model prefix: the prompt opens the think block so the completion starts reasoning at once.
BASE_PREFIX = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer.\n"
    "User: {user}\nAssistant: Let me solve this step by step.\n<think>"
)
COUNTDOWN_USER = (
    "Using the numbers {numbers}, create an equation that equals {target}. "
    "You can use + - * / and each number exactly once."
)
MATH_USER = "{question}\nShow your reasoning in <think> </think> and give only the final number in <answer> </answer>."


class DataConfig(BaseModel):
    """Which task the prompts come from, how they are rendered and how many there are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Literal["countdown", "math", "gsm8k"] = "countdown"
    """countdown: generated puzzles; math: generated word problems; gsm8k: a local GSM8K JSONL file."""
    template: Literal["chat", "base"] = "chat"
    """chat: system + user messages for a chat template; base: TinyZero's plain-text prefix ending in `<think>`."""
    assistant_prefix: str = ""
    """Chat only: text the assistant's turn starts with (e.g. "<think>\n"), as TinyZero's base template does, so a
    small model starts on the format's track; the format reward accepts a completion without the opening tag."""
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


@dataclass(frozen=True)
class Prompt:
    """One prompt, rendered for the configured template, with what its reward needs."""

    uid: str
    """Stable id, e.g. "countdown-train-000123"."""
    task: str
    """"countdown" | "math"."""
    messages: tuple[dict[str, str], ...] | None
    """Chat template input (role/content) when the template is chat."""
    text: str | None
    """Raw prompt text when the template is base."""
    reference: dict[str, Any]
    """countdown {"numbers", "target", "solution"}; math {"answer"}."""


def setup_dataset(cfg: DataConfig, split: Literal["train", "eval"]) -> list[Prompt]:
    """The prompts of one split; deterministic given cfg."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    size = cfg.train_size if split == "train" else cfg.eval_size
    if cfg.task == "gsm8k":
        task, rows = "math", _gsm8k_rows(cfg, split)[:size]
    elif cfg.task == "math":
        task, rows = "math", _draw(_word_problem, cfg, split, size, key=lambda r: r[0])
    else:
        task = "countdown"
        rows = _draw(lambda rng: _countdown_puzzle(rng, cfg), cfg, split, size, key=lambda r: (sorted(r[0]), r[1]))
    prompts = []
    for index, row in enumerate(rows):
        if task == "countdown":
            numbers, target, solution = row
            user = COUNTDOWN_USER.format(numbers=list(numbers), target=target)
            reference: dict[str, Any] = {"numbers": list(numbers), "target": target, "solution": solution}
        else:
            user, reference = MATH_USER.format(question=row[0]), {"answer": row[1]}
        messages, text = _render(user, cfg.template)
        prompts.append(Prompt(f"{task}-{split}-{index:06d}", task, messages, text, reference))
    return prompts


def _render(user: str, template: str) -> tuple[tuple[dict[str, str], ...] | None, str | None]:
    if template == "chat":
        return ({"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}), None
    return None, BASE_PREFIX.format(user=user)


def _draw(make: Callable[[random.Random], Any], cfg: DataConfig, split: str, size: int, key: Callable) -> list:
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
        if content in seen or _is_eval(content) != (split == "eval"):
            continue
        seen.add(content)
        items.append(item)
    if len(items) < size:
        raise ValueError(
            f"only {len(items)} distinct {cfg.task} {split} items after {budget} draws (asked {size}); "
            "lower the split size or widen the generator (max_number, max_target)"
        )
    return items


def _is_eval(content: str) -> bool:
    # A content hash, not hash(): Python salts str hashes per process, which would reshuffle the splits.
    return hashlib.blake2b(content.encode(), digest_size=8).digest()[0] % EVAL_BUCKETS == 0


def _countdown_puzzle(rng: random.Random, cfg: DataConfig) -> tuple[list[int], int, str] | None:
    """Random numbers and a random valid expression over all of them; None when no draw lands in range."""
    count = rng.randint(*cfg.countdown_numbers)
    # Retry with the same count: rejecting whole draws would skew puzzles towards fewer numbers (smaller values).
    for _ in range(100):
        numbers = [rng.randint(1, cfg.max_number) for _ in range(count)]
        target, solution = _random_expression(rng, numbers)
        if 1 <= target <= cfg.max_target:
            return numbers, target, solution
    return None


def _random_expression(rng: random.Random, numbers: list[int]) -> tuple[int, str]:
    """Combine random pairs with a random operator whose result is a positive integer, until one value is left."""
    items = [(n, str(n)) for n in numbers]
    while len(items) > 1:
        (a, left), (b, right) = (items.pop(rng.randrange(len(items))) for _ in range(2))
        if a < b:
            (a, left), (b, right) = (b, right), (a, left)
        options = [(a + b, "+"), (a * b, "*")]
        if a != b:
            options.append((a - b, "-"))
        if b > 1 and a % b == 0:
            options.append((a // b, "/"))
        value, op = rng.choice(options)
        items.append((value, f"{_wrap(left)} {op} {_wrap(right)}"))
    return items[0]


def _wrap(expr: str) -> str:
    return f"({expr})" if " " in expr else expr


NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Kira", "Liam", "Mei")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards")


def _word_problem(rng: random.Random) -> tuple[str, str]:
    """A GSM8K-style question with an exact integer answer (as text)."""
    name, item, r = rng.choice(NAMES), rng.choice(ITEMS), rng.randint
    kind = r(0, 5)
    if kind == 0:
        a, b, c = r(2, 40), r(2, 9), r(2, 12)
        d = r(1, a + b * c - 1)
        q = f"{name} has {a} {item}. {name} buys {b} packs of {c} {item} and gives {d} away. How many {item} are left?"
        return q, str(a + b * c - d)
    if kind == 1:
        price, count = r(2, 15), r(2, 9)
        bill = (price * count // 10 + r(1, 5)) * 10
        q = f"{item.capitalize()} cost ${price} each. {name} buys {count} and pays with ${bill}. How much change?"
        return q, str(bill - price * count)
    if kind == 2:
        a, d, b, e = r(5, 40), r(2, 9), r(5, 40), r(2, 9)
        q = f"{name} reads {a} pages a day for {d} days, then {b} pages a day for {e} days. How many pages in total?"
        return q, str(a * d + b * e)
    if kind == 3:
        friends, each = r(2, 9), r(2, 20)
        total = friends * each + r(0, friends - 1)
        q = f"{name} shares {total} {item} equally among {friends} friends and keeps the rest. How many does each get?"
        return q, str(each)
    if kind == 4:
        v, t, w, s = r(20, 90), r(2, 6), r(20, 90), r(2, 6)
        q = f"A train goes {v} km per hour for {t} hours, then {w} km per hour for {s} hours. How many km is that?"
        return q, str(v * t + w * s)
    wage, hours, weeks = r(8, 30), r(5, 40), r(2, 8)
    q = f"{name} earns ${wage} an hour and works {hours} hours a week. How many dollars is that in {weeks} weeks?"
    return q, str(wage * hours * weeks)


def _gsm8k_rows(cfg: DataConfig, split: str) -> list[tuple[str, str]]:
    """(question, final answer) rows of the split; eval is gsm8k_eval_path or the tail of gsm8k_path."""
    if split == "eval" and cfg.gsm8k_eval_path:
        return _read_gsm8k(Path(cfg.gsm8k_eval_path))
    rows = _read_gsm8k(Path(cfg.gsm8k_path or ""))
    if cfg.gsm8k_eval_path:
        return rows
    if cfg.eval_size >= len(rows):
        raise ValueError(f"data.eval_size ({cfg.eval_size}) leaves no train rows of {len(rows)} in {cfg.gsm8k_path}")
    cut = len(rows) - cfg.eval_size
    return rows[cut:] if split == "eval" else rows[:cut]


def _read_gsm8k(path: Path) -> list[tuple[str, str]]:
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


class PromptStream:
    """Endless seeded batches over prompts, reshuffled each epoch; `state_dict` resumes it exactly.

    Batches are always full: the last batch of an epoch continues into the next epoch's order. The state is just
    (epoch, position) because each epoch's order is recomputed from (seed, epoch).
    """

    def __init__(self, prompts: Sequence[Prompt], batch_size: int, seed: int):
        if not prompts:
            raise ValueError("PromptStream needs at least one prompt; check data.train_size and the dataset")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._prompts, self.batch_size, self.seed = list(prompts), batch_size, seed
        self._set(epoch=0, position=0)

    @property
    def epoch(self) -> int:
        return self._epoch

    def next_batch(self) -> list[Prompt]:
        batch: list[Prompt] = []
        while len(batch) < self.batch_size:
            if self._position == len(self._order):
                self._set(self._epoch + 1, 0)
            take = min(self.batch_size - len(batch), len(self._order) - self._position)
            batch.extend(self._prompts[i] for i in self._order[self._position : self._position + take])
            self._position += take
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "position": self._position, "num_prompts": len(self._prompts), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_prompts") != len(self._prompts) or state.get("seed") != self.seed:
            raise ValueError(
                f"stream state is for {state.get('num_prompts')} prompts with seed {state.get('seed')}, this one has "
                f"{len(self._prompts)} with seed {self.seed}; resume with the run's saved data config"
            )
        if not 0 <= state["position"] <= len(self._prompts):
            raise ValueError(f"stream state position {state['position']} outside 0..{len(self._prompts)}")
        self._set(int(state["epoch"]), int(state["position"]))

    def _set(self, epoch: int, position: int) -> None:
        self._epoch, self._position = epoch, position
        self._order = list(range(len(self._prompts)))
        random.Random(f"stream-{self.seed}-{epoch}").shuffle(self._order)
