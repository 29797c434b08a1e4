"""What a guesser that ignores the environment's replies scores on the guessing game's held-out games: the floor a
trained policy must clear to show it reads "Higher." / "Lower.", not only that it answers with a number.

A policy that makes k valid, distinct guesses at random in 1..high wins a game with probability min(k / high, 1);
averaged over the held-out games of the config (the games `orchestration.cli.eval` plays):

    .venv/bin/python bench/guessing_floor.py                          # configs/guess_smollm2_cpu.yaml, 52 games
    .venv/bin/python bench/guessing_floor.py --guesses 4.76           # e.g. a run's measured env/guesses_mean
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "guess_smollm2_cpu.yaml")
    p.add_argument("--limit", type=int, default=None, help="held-out games (default: the config's eval.prompts)")
    p.add_argument("--guesses", type=float, default=None, help="valid distinct guesses a game (default: max_turns)")
    args = p.parse_args()
    from orchestration.config.files import load_config
    from tasks.heldout import eval_prompts
    from orchestration.problem import run_environment

    cfg = load_config(args.config)
    games = eval_prompts(cfg.data, args.limit or cfg.eval.prompts, environment=run_environment(cfg))  # eval's own
    highs = [game.reference["high"] for game in games]
    k = args.guesses if args.guesses is not None else cfg.environment.max_turns
    floor = sum(min(k / high, 1.0) for high in highs) / len(highs)
    print(f"{len(highs)} held-out games, highs {min(highs)}..{max(highs)}: {k:g} valid distinct guesses at random, "
          f"no use of the replies, win {floor:.3f} in expectation; binary search wins 1.000 "
          f"(max_turns {cfg.environment.max_turns})")


if __name__ == "__main__":
    main()
