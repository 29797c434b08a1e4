"""What an LLM-judge reward costs a training step: its throughput and its share of the step, in one run.

Runs `python -m orchestration.cli.train` on the demo config with a judge term added at weight 0 (so the policy trains
exactly as the demo does, and only the judge's cost is added), then prints from that run's metrics.jsonl (the
first step, which compiles, left out):

- judge tokens/s (rubric + reply tokens per second of judging) and reply tokens/s;
- judge reply tokens/s / policy generation tokens/s, the same engine's two workloads side by side;
- judge time / step time (`judge/step_share`), and judge time per graded sample / generation time per sample.

    .venv/bin/python bench/bench_judge.py                      # SmolLM2 demo, judge on the training engine
    .venv/bin/python bench/bench_judge.py --engine judge       # a separate SmolLM2 judge engine
    .venv/bin/python bench/bench_judge.py --steps 3 model.path=tiny-llama

The rubric asks for a 0/1 grade of the equation against the puzzle, greedy, one reply token, constrained to the
tokens `0` and `1` (SmolLM2's tokenizer: ids 32 and 33): a 135M judge grades poorly, but its cost is what a judge
of this size costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from orchestration.metrics import read_metrics  # noqa: E402

RUBRIC = ("Puzzle: make {reference[target]} from the numbers {reference[numbers]} with + - * /, each number once. "
          "Answer: {completion}\nIs the answer a correct equation for the puzzle? Reply 1 for yes, 0 for no.")
JUDGE_SAMPLING = {"temperature": 0.0, "max_tokens": 1, "extra": {"allowed_token_ids": [32, 33]}}


def judge_overrides(engine: str, config: Path) -> list[str]:
    """The config's reward terms plus a weight-0 judge term on `engine`."""
    from orchestration.config.files import load_config

    terms = [t.model_dump() for t in load_config(config).rewards.terms]
    judge = {"name": "judge", "weight": 0.0,
             "params": {"template": RUBRIC, "engine": engine, "sampling": JUDGE_SAMPLING}}
    out = [f"rewards.terms={json.dumps([*terms, judge])}"]  # JSON is YAML, as overrides are read
    if engine == "judge":
        out += ["judge_engine.model.path=smollm2-135m-instruct", "judge_engine.backend.kind=vllm",
                "judge_engine.backend.max_model_len=1024", "judge_engine.backend.kv_cache_space_gb=1"]
    return out


def mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "countdown_smollm2_cpu.yaml")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--engine", choices=("policy", "judge"), default="policy",
                   help="policy: the training engine's base model; judge: a separate SmolLM2 engine")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="aha-bench-judge-") as tmp:
        cmd = [sys.executable, "-m", "orchestration.cli.train", "--config", str(args.config), "--run-dir", f"{tmp}/run",
               f"train.steps={args.steps}", "train.save_every=0", "logging.plots=false", "eval.every=0",
               *judge_overrides(args.engine, args.config), *args.overrides]
        print(f"running: {' '.join(cmd[3:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rows = read_metrics(Path(tmp) / "run")[1:]  # the first step compiles
    samples = mean(rows, "judge/requests") + mean(rows, "judge/cache_hits")
    generated = mean(rows, "rollout/completion_len_mean") * samples
    judge_s, gen_s, step_s = mean(rows, "judge/seconds"), mean(rows, "timing/generate"), mean(rows, "timing/step")
    print(f"\nsteps measured: {len(rows)} (first excluded); engine: {args.engine}; {samples:.0f} samples judged a step")
    print(f"judge tokens/s (rubric + reply)   {mean(rows, 'judge/tokens_per_s'):9.1f}")
    print(f"judge reply tokens/s              {mean(rows, 'judge/completion_tokens_per_s'):9.1f}")
    print(f"policy generation tokens/s        {mean(rows, 'rollout/tokens_per_s'):9.1f}")
    print(f"judge {judge_s:.2f} s, generate {gen_s:.2f} s, step {step_s:.2f} s (means)")
    print(f"ratio judge reply tok/s / policy tok/s = "
          f"{mean(rows, 'judge/completion_tokens_per_s') / mean(rows, 'rollout/tokens_per_s'):.3f}")
    print(f"ratio judge time / step time = {judge_s / step_s:.3f} (judge/step_share mean "
          f"{mean(rows, 'judge/step_share'):.3f})")
    print(f"ratio judge time / generate time = {judge_s / gen_s:.3f} ({generated / samples:.1f} policy tokens, "
          f"{mean(rows, 'judge/prompt_tokens') / samples:.0f} rubric tokens per sample)")

if __name__ == "__main__":
    main()
