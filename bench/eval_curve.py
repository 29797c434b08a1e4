"""A run's held-out curve against the one-line policies: its in-loop evals (`eval.every`) per step, and what each
policy of bench/heuristic_policies.py scores on the same held-out puzzles (the first `eval.prompts` of the eval
split, as the in-loop eval draws them). Prints a Markdown table and draws a PNG.

    .venv/bin/python bench/eval_curve.py RUN_DIR --png docs/demo_long.png --title "the demo, 120 steps"

The in-loop intervals are Wilson's over the samples (eval.prompts x eval.k), narrower than the interval over
puzzles that `aha eval` bootstraps; the policies' intervals are over the puzzles (a policy answers each one way).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heuristic_policies import policy_accuracy  # noqa: E402

from orchestration.config.files import load_config  # noqa: E402
from orchestration.metrics import read_metrics  # noqa: E402


def eval_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if isinstance(r.get("eval/accuracy"), (int, float))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--png", type=Path, default=None, help="draw the curve here")
    p.add_argument("--title", default=None, help="the plot's title (default: the run folder's name)")
    args = p.parse_args(argv)
    rows = eval_rows(args.run_dir)
    if not rows:
        raise SystemExit(f"{args.run_dir}: no in-loop eval rows in metrics.jsonl (the run had eval.every 0)")
    cfg = load_config(args.run_dir / "config.yaml")
    policies = policy_accuracy(args.run_dir / "config.yaml", [], cfg.eval.prompts, None)

    print(f"held-out: the first {cfg.eval.prompts} puzzles x {cfg.eval.k} samples, T={cfg.rollout.sampling.temperature}")
    print("| step | accuracy [Wilson 95%, over samples] | pass@k |")
    print("|---|---|---|")
    for r in rows:
        k = next((key for key in r if key.startswith("eval/pass@") and "_" not in key), None)
        passk = f"{r[k]:.3f}" if k else "-"
        print(f"| {r['step']} | {r['eval/accuracy']:.3f} [{r['eval/accuracy_low']:.3f}, {r['eval/accuracy_high']:.3f}] "
              f"| {passk} |")
    print()
    print("| one-line policy | accuracy [Wilson 95%, over puzzles] |")
    print("|---|---|")
    for name, iv in policies.items():
        print(f"| {name} | {iv.value:.3f} [{iv.low:.3f}, {iv.high:.3f}] |")
    if args.png:
        draw(rows, policies, args.png, f"{args.title or args.run_dir.name}: held-out accuracy, {cfg.eval.prompts} "
                                       f"puzzles x {cfg.eval.k}")
        print(f"\nwrote {args.png}")
    print(json.dumps({"steps": [r["step"] for r in rows], "accuracy": [r["eval/accuracy"] for r in rows]}))


def draw(rows: list[dict], policies: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in rows]
    vals = [r["eval/accuracy"] for r in rows]
    err = [[v - r["eval/accuracy_low"] for v, r in zip(vals, rows)],
           [r["eval/accuracy_high"] - v for v, r in zip(vals, rows)]]
    ax.errorbar(steps, vals, yerr=err, marker="o", capsize=3, linewidth=2, label="trained policy (in-loop eval)")
    for (name, iv), style in zip(policies.items(), ["--", "-.", ":", ":", "-"]):
        if iv.value >= 0.2:  # the operators that never fit (x, /) would only crowd the plot's floor
            ax.axhline(iv.value, linestyle=style, color="gray", linewidth=1)
            ax.text(steps[-1], iv.value + 0.01, name, ha="right", va="bottom", fontsize=8, color="dimgray")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
