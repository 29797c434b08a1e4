"""Two trained runs on the same held-out puzzles, paired: B's trained policy minus A's, per puzzle, with a paired
bootstrap 95% interval over puzzles (orchestration/report/stats.py), from each run's `aha eval` output.

    .venv/bin/python bench/compare_evals.py runs/sync-demo runs/async-demo

Both evals must have scored the same prompts with the same k, data seed, sampling and seeded schedule (their
eval.json say so; it refuses otherwise), so sample i of puzzle j was drawn with the same request seed in both:
the difference is the policies', not the draw's. Also prints each run's accuracy with its interval over puzzles,
against the best single operator's accuracy on the same puzzles when given (`--floor`, bench/heuristic_policies.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from orchestration.report import stats

SAME = ("task", "prompts", "k", "data_seed", "sampling", "schedule")


def trained_rewards(run: Path) -> tuple[dict, np.ndarray]:
    """(eval.json, [prompts, k] task rewards of the trained phase) of a run's `aha eval`."""
    meta = json.loads((run / "eval.json").read_text())
    rows = [json.loads(line) for line in (run / "eval_samples.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["phase"] == "trained"]
    out = np.zeros((meta["prompts"], meta["k"]))
    for r in rows:
        out[r["prompt"], r["sample"]] = r["reward"]
    return meta, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--floor", type=float, default=None, help="the best one-line policy's accuracy on these puzzles")
    args = p.parse_args()
    (meta_a, a), (meta_b, b) = trained_rewards(args.a), trained_rewards(args.b)
    differ = [key for key in SAME if meta_a.get(key) != meta_b.get(key)]
    if differ:
        raise SystemExit(f"the two evals differ in {differ}: evaluate both with the same --limit, --k, seed and "
                         "sampling (aha eval RUN --limit 200 --k 4)")
    for name, r in ((args.a, a), (args.b, b)):
        over = stats.bootstrap_mean((r == 1.0).mean(axis=1))
        above = "" if args.floor is None else f"; lower bound {'above' if over.low > args.floor else 'not above'} " \
            f"the floor {args.floor}"
        print(f"{name}: accuracy {over.value:.3f} [{over.low:.3f}, {over.high:.3f}] over {len(r)} puzzles{above}")
    diff = stats.paired_differences(stats.per_prompt_metrics(a == 1.0, a), stats.per_prompt_metrics(b == 1.0, b))
    for key, iv in diff.items():
        print(f"B - A {key}: {iv.value:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}] (paired bootstrap over puzzles)")


if __name__ == "__main__":
    main()
