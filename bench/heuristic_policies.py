"""What one-line answer policies score on the demo's held-out Countdown puzzles: the floor a trained policy must beat.

Each policy writes one equation from the puzzle's two numbers without any model (`a + b`, larger minus smaller,
`a * b`, larger / smaller, and "`+` if the target exceeds both numbers, else larger minus smaller"); the config's
own reward scores it, on the held-out puzzles `orchestration.cli.eval` uses (`tasks.heldout.eval_prompts`),
so the figures compare with `python -m orchestration.cli.eval RUN_DIR --limit 200 --k 4` directly. A deterministic
policy's accuracy is over puzzles; the Wilson interval is over the same 200.

    .venv/bin/python bench/heuristic_policies.py                      # the demo config, 200 puzzles, seed 0
    .venv/bin/python bench/heuristic_policies.py --limit 400 data.eval_size=400 --seed 1
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from orchestration.report import stats
from orchestration.config.files import load_config
from tasks.heldout import eval_prompts
from rewards.registry import setup_rewards
from rewards.types import Sample

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "countdown_smollm2_cpu.yaml"


def _larger_first(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a >= b else (b, a)


def _minus(a: int, b: int, _target: int) -> str:
    hi, lo = _larger_first(a, b)
    return f"{hi} - {lo}"


def _divide(a: int, b: int, _target: int) -> str:
    hi, lo = _larger_first(a, b)
    return f"{hi} / {lo}"


def _compare(a: int, b: int, target: int) -> str:
    return f"{a} + {b}" if target > max(a, b) else _minus(a, b, target)


POLICIES: dict[str, Callable[[int, int, int], str]] = {
    "always +": lambda a, b, t: f"{a} + {b}",
    "larger - smaller": _minus,
    "always x": lambda a, b, t: f"{a} * {b}",
    "larger / smaller": _divide,
    "+ if target > both, else -": _compare,
}
"""name -> (a, b, target) -> the equation line it answers (`= target` appended, as the trained policy writes it)."""


def policy_accuracy(config: Path, overrides: list[str], limit: int, seed: int | None) -> dict[str, stats.Interval]:
    """Each policy's accuracy (task reward >= 1) on the first `limit` held-out puzzles, with Wilson intervals."""
    cfg = load_config(config, overrides)
    prompts = eval_prompts(cfg.data, limit, seed)
    if any(len(p.reference.get("numbers", ())) != 2 for p in prompts):
        raise SystemExit("the one-line policies take two numbers: use a config with data.countdown_numbers [2, 2]")
    rewards = setup_rewards(cfg.rewards)
    out = {}
    for name, policy in POLICIES.items():
        samples = [Sample("", f"{policy(*p.reference['numbers'], p.reference['target'])} = {p.reference['target']}",
                          p.reference) for p in prompts]
        solved = [v >= 1.0 for v in rewards.score(samples).per_name["countdown"]]
        out[name] = stats.wilson(sum(solved), len(solved))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--limit", type=int, default=200, help="held-out puzzles (orchestration.cli.eval's --limit)")
    p.add_argument("--seed", type=int, default=None, help="data seed of the held-out puzzles (default: the config's)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_intermixed_args(argv)
    results = policy_accuracy(args.config, args.overrides, args.limit, args.seed)
    width = max(map(len, results))
    for name, iv in results.items():
        print(f"{name:<{width}}  accuracy {iv}")
    best_single = max((iv.value, name) for name, iv in results.items() if not name.startswith("+ if"))
    print(f"best single operator: {best_single[1]} {best_single[0]:.3f}")
    if args.json:
        args.json.write_text(json.dumps({n: iv.as_dict() for n, iv in results.items()}, indent=1))


if __name__ == "__main__":
    main()
