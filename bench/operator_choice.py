"""Which operator a Countdown run's policy writes, against the one each puzzle needs: has it learned when to add and
when to subtract, or only the format?

Reads a run's samples.jsonl (the first prompt of each step and its n samples) and counts, per (operator the puzzle
needs, operator written, for `-` whether the larger number came first), the samples and their reward:

    .venv/bin/python bench/operator_choice.py runs/demo1 --from-step 25

Two-number puzzles only (the demo's). "Needs" is the first of + - * / that makes the target from the two numbers.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

PUZZLE = re.compile(r"numbers \[(\d+), (\d+)\].*?equals (\d+)", re.S)
ANSWER = re.compile(r"\s*(\d+)\s*([-+*/x])\s*(\d+)")


def needed(a: int, b: int, target: int) -> str:
    if a + b == target:
        return "+"
    if abs(a - b) == target:
        return "-"
    if a * b == target:
        return "*"
    return "/"


def written(completion: str) -> str:
    """The operator of the answer's first `a op b`, with `-` split by which number came first; `?` if none."""
    m = ANSWER.match(completion)
    if m is None:
        return "?"
    if m.group(2) != "-":
        return m.group(2)
    return "- larger first" if int(m.group(1)) >= int(m.group(3)) else "- smaller first"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--from-step", type=int, default=1, help="only steps from this one on")
    args = p.parse_args()
    counts: collections.Counter = collections.Counter()
    for line in (args.run_dir / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        puzzle = PUZZLE.search(row["prompt"])
        if row["step"] < args.from_step or puzzle is None:
            continue
        need = needed(*map(int, puzzle.groups()))
        for completion, reward in zip(row["completions"], row["rewards"]):
            counts[(need, written(completion), reward > 0)] += 1
    print(f"{'needs':>6} {'written':>16} {'scored':>7} {'samples':>8}")
    for (need, wrote, scored), n in sorted(counts.items()):
        print(f"{need:>6} {wrote:>16} {'yes' if scored else 'no':>7} {n:>8}")


if __name__ == "__main__":
    main()
