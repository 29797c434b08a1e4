"""End-to-end loop benchmark: sync vs async step time, and the LoRA push pause as a fraction of a step.

Runs `python -m orchestration.cli.train` twice on the same config and load (sync, then async) and prints, from
those runs' metrics.jsonl (the first step of each, which compiles, is left out):

- sync step time, async step time, and async / max(generate, learn) (target <= 1.1: async hides the shorter phase);
- push pause / step time (target < 1%);
- with --tunix: the same model and batch through Tunix's own colocated GRPOLearner pipeline
  (`bench/bench_tunix_loop.py`: Tunix's in-process sampler + its GRPO update), and ours / Tunix's step time
  (target <= 0.7).

    .venv/bin/python bench/bench_loop.py --tunix --pin         # SmolLM2, the demo config, 6 steps each
    .venv/bin/python bench/bench_loop.py --steps 4 model.path=tiny-llama

Unpinned, the engine and the learner share every core, so async can only hide what the other phase leaves idle.
`--pin` gives each part its own cores, as on a TPU host each has its own chips: the engine the first half of the
machine's cores (`rollout.backend.cpu_cores`), the learner the rest (`learner.cpu_cores`); Tunix's colocated loop
gets all of them, the same cores in total.

Figures and their history: docs/benchmarks.md (the bench_loop rows).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The loop's mechanics at the demo's shape, like for like with Tunix's loop: one draw per step (a refill's extra
# generation varies from step to step) and no KL term (Tunix's side runs without a reference model).
LIKE_FOR_LIKE = ["train.dynamic_sampling.enabled=false", "learner.grpo.kl_beta=0.0"]

from orchestration.metrics import read_metrics  # noqa: E402


def run(mode: str, steps: int, config: Path, overrides: list[str], out: Path) -> list[dict]:
    run_dir = out / mode
    cmd = [sys.executable, "-m", "orchestration.cli.train", "--config", str(config), "--run-dir", str(run_dir),
           f"train.mode={mode}", f"train.steps={steps}", "train.save_every=0", "logging.plots=false", *overrides]
    print(f"running {mode}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return read_metrics(run_dir)[1:]  # drop the compile step


def tunix_step_s(steps: int, config: Path, overrides: list[str]) -> float:
    """Tunix's colocated pipeline on the same model and batch as our runs (read from the resolved config)."""
    from orchestration.config.files import load_config

    cfg = load_config(config, overrides)
    cmd = [sys.executable, str(ROOT / "bench" / "bench_tunix_loop.py"), "--steps", str(steps), "--config", str(config),
           "--model", str(cfg.model.path), "--max-tokens", str(cfg.rollout.sampling.max_tokens),
           "--prompts-per-step", str(cfg.train.prompts_per_step), "--n", str(cfg.rollout.sampling.n), *overrides]
    print(f"running tunix: {' '.join(cmd[1:])}", flush=True)
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    print("".join(line + "\n" for line in out.splitlines() if line.startswith("tunix")), end="")
    return float(re.search(r"^tunix_step_s: ([0-9.]+)", out, re.M).group(1))


def pinned_cores() -> list[str]:
    """Overrides giving the engine the first half of this process's cores and the learner the rest."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least 2 cores")
    half = len(cores) // 2
    as_list = lambda cs: "[" + ",".join(map(str, cs)) + "]"  # noqa: E731
    return [f"rollout.backend.cpu_cores={as_list(cores[:half])}", f"learner.cpu_cores={as_list(cores[half:])}"]


def mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rows if key in r)


COMPILED_S = 1.0  # a step whose learner spent longer than this making programs met a new shape


def compiles(rows: list[dict]) -> int:
    return sum(r.get("learner/compile_s", 0.0) > COMPILED_S for r in rows)


def without_compiles(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("learner/compile_s", 0.0) <= COMPILED_S]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "countdown_smollm2_cpu.yaml")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--tunix", action="store_true", help="also time Tunix's colocated GRPOLearner pipeline")
    p.add_argument("--pin", action="store_true", help="the engine on the first half of the cores, the learner on "
                   "the rest (Tunix: all of them)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    args.overrides = LIKE_FOR_LIKE + args.overrides
    ours_overrides = args.overrides + (pinned_cores() if args.pin else [])
    with tempfile.TemporaryDirectory(prefix="aha-bench-") as tmp:
        sync = run("sync", args.steps, args.config, ours_overrides, Path(tmp))
        async_ = run("async", args.steps, args.config, ours_overrides, Path(tmp))
    t_sync, t_async = mean(sync, "timing/step"), mean(async_, "timing/step")
    gen, learn = mean(sync, "timing/generate"), mean(sync, "timing/learn")
    pause = mean(sync, "timing/push_pause")
    print(f"\nsteps measured: {len(sync)} sync, {len(async_)} async (first step of each excluded)")
    print(f"compiles in them: sync {compiles(sync)}, async {compiles(async_)} (learner/compile_s > {COMPILED_S} s)")
    print(f"sync step        {t_sync:8.2f} s   (generate {gen:.2f} s, learn {learn:.2f} s)")
    print(f"async step       {t_async:8.2f} s")
    print(f"async / max(generate, learn) = {t_async / max(gen, learn):.3f}   (target <= 1.1)")
    print(f"async / sync                 = {t_async / t_sync:.3f}")
    warm_sync, warm_async = without_compiles(sync), without_compiles(async_)
    if warm_sync and warm_async:  # the loop's overlap alone: a compile is the learner's cost, not the loop's
        w_gen, w_learn = mean(warm_sync, "timing/generate"), mean(warm_sync, "timing/learn")
        print(f"steps that compiled nothing ({len(warm_sync)} sync, {len(warm_async)} async): async / max = "
              f"{mean(warm_async, 'timing/step') / max(w_gen, w_learn):.3f}")
    print(f"push pause / step            = {pause / t_sync:.4f}   ({pause * 1000:.0f} ms; target < 0.01)")
    if args.tunix:
        theirs = tunix_step_s(args.steps, args.config, args.overrides)
        print(f"tunix colocated step {theirs:8.2f} s")
        print(f"ours / tunix = {min(t_sync, t_async) / theirs:.3f} (best of sync/async; target <= 0.7)")


if __name__ == "__main__":
    main()
