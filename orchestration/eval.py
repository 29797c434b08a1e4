"""`python -m orchestration.eval RUN_DIR`: base vs trained on the held-out split, through the same engine.

For each eval prompt it draws k samples (the run's sampling parameters, n = k) from the base model, then from
the run's final adapter, and reports mean reward, accuracy (samples whose task reward is 1.0) and pass@k
(prompts with at least one such sample). Results go to RUN_DIR/eval.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

from orchestration import signals
from orchestration.config import ConfigError, RunConfig, load_config

log = logging.getLogger("orchestration.eval")
TASK_REWARDS = ("countdown", "math_answer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestration.eval", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--k", type=int, default=4, help="samples per prompt (pass@k)")
    p.add_argument("--limit", type=int, default=64, help="eval prompts to use (from the held-out split)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. rollout.sampling.temperature=0.7")
    return p.parse_args(argv)


def load_adapter(adapter_dir: Path) -> tuple[dict[str, np.ndarray], dict]:
    from safetensors.numpy import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors")), json.loads((adapter_dir / "adapter_config.json").read_text())


def evaluate(cfg: RunConfig, rollout, renderer, rewards, prompts, k: int) -> dict[str, float]:
    """Mean reward, per-reward means, accuracy and pass@k of the policy currently on the server."""
    from rewards.types import Sample

    params = cfg.rollout.sampling.model_copy(update={"n": k})
    groups = rollout.generate([renderer.encode(p) for p in prompts], params)
    samples = [Sample(renderer.text(p), c.text, p.reference) for p, g in zip(prompts, groups) for c in g]
    result = rewards.score(samples)
    task = next((n for n in TASK_REWARDS if n in result.per_name), None)
    out = {"reward_mean": float(np.mean(result.totals)),
           **{f"reward/{n}": float(np.mean(v)) for n, v in result.per_name.items()}}
    if task:
        solved = np.asarray(result.per_name[task]).reshape(len(prompts), k) >= 1.0
        out["accuracy"] = float(solved.mean())
        out[f"pass@{k}"] = float(solved.any(axis=1).mean())
    return out


def main(argv: list[str] | None = None) -> int:
    signals.install()  # Ctrl-C / SIGTERM work even when started with SIGINT ignored (nohup, `&` in a script)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.run_dir / "config.yaml", args.overrides)
        if args.k < 1 or (args.k > 1 and cfg.rollout.sampling.temperature == 0):
            raise ConfigError(f"--k {args.k}: use k >= 1, and k = 1 when rollout.sampling.temperature is 0")
    except ConfigError as err:
        print(f"eval: {err}", file=sys.stderr)
        return 2
    adapter_dir = args.run_dir / "adapter"
    if not (adapter_dir / "adapter_model.safetensors").exists():
        print(f"eval: {adapter_dir} has no adapter; finish the run first (--resume)", file=sys.stderr)
        return 2
    import ray

    from orchestration.data import setup_dataset
    from orchestration.prompts import PromptRenderer
    from rewards.registry import setup_rewards
    from rollout.handle import Rollout

    prompts = setup_dataset(cfg.data, "eval")[: args.limit]
    renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
    rewards = setup_rewards(cfg.rewards)
    ray.init(address="local", include_dashboard=False, num_cpus=max(2, int(cfg.rollout.resources.num_cpus) + 1))
    try:
        with Rollout(cfg.rollout, cfg.model.resolved_path) as rollout:
            base = evaluate(cfg, rollout, renderer, rewards, prompts, args.k)
            tensors, adapter_config = load_adapter(adapter_dir)
            rollout.push_lora(1, tensors, adapter_config)
            trained = evaluate(cfg, rollout, renderer, rewards, prompts, args.k)
    finally:
        ray.shutdown()
    report = {"prompts": len(prompts), "k": args.k, "base": base, "trained": trained}
    (args.run_dir / "eval.json").write_text(json.dumps(report, indent=2))
    print(f"\n{len(prompts)} held-out prompts x {args.k} samples ({cfg.data.task})")
    print(f"{'metric':<24}{'base':>10}{'trained':>10}")
    for key in trained:
        print(f"{key:<24}{base.get(key, float('nan')):>10.3f}{trained[key]:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
