"""Compare two runs' metrics.jsonl step by step: is a change to the learner or the loop bit-for-bit the old one?

    .venv/bin/python bench/compare_runs.py RUN_A RUN_B [--keys reward/total,learner/loss,...]

Prints each step's figures and where they differ, then one line: identical or not. The demo's seeded runs of two
commits (`aha train --config configs/countdown_smollm2_cpu.yaml --run-dir RUN train.steps=8 eval.every=0`) give
the same rewards and learner figures when the change moved no arithmetic (docs/demo.md); engine-side figures such as
`learner/logprob_abs_diff` may move in the last digits, since vLLM's CPU numerics depend on how it batched requests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEYS = ("reward/total", "learner/loss", "learner/grad_norm", "learner/entropy", "learner/adv_std",
        "learner/logprob_abs_diff")


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--keys", default=",".join(KEYS), help="comma-separated metric names")
    args = parser.parse_args()
    keys = args.keys.split(",")
    a, b = rows(args.a), rows(args.b)
    differ = set()
    for ra, rb in zip(a, b):
        cells = []
        for k in keys:
            x, y = ra.get(k), rb.get(k)
            cells.append(f"{k}={x!r}" if x == y else f"{k}={x!r} != {y!r}")
            if x != y:
                differ.add(k)
        print(f"step {ra['step']}: " + "  ".join(cells))
    steps = min(len(a), len(b))
    print(f"{steps} steps: " + ("identical in " + ", ".join(keys) if not differ else
                                "differ in " + ", ".join(sorted(differ))))


if __name__ == "__main__":
    main()
