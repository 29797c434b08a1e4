"""Task generators: Countdown puzzles with a known solution, GSM8K-style word problems with exact integer answers."""

from __future__ import annotations

import random

from tasks.config import DataConfig


def countdown_puzzle(rng: random.Random, cfg: DataConfig) -> tuple[list[int], int, str] | None:
    """Random numbers and a random valid expression over all of them; None when no draw lands in range."""
    count = rng.randint(*cfg.countdown_numbers)
    # Retry with the same count: rejecting whole draws would skew puzzles towards fewer numbers (smaller values).
    for _ in range(100):
        numbers = [rng.randint(1, cfg.max_number) for _ in range(count)]
        target, solution = random_expression(rng, numbers)
        if 1 <= target <= cfg.max_target:
            return numbers, target, solution
    return None


def random_expression(rng: random.Random, numbers: list[int]) -> tuple[int, str]:
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


def word_problem(rng: random.Random) -> tuple[str, str]:
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
