"""Your own task, for real: the documented example (a JSONL file and rewards by import path) trained end to end on
the tiny model, with hostile rewards beside it; and a reward module found through a Ray runtime_env working_dir.

One training run (`python -m orchestration.cli.train` in a subprocess: its own Ray cluster, the vLLM server, the JAX
learner, the reward pool). Assertions read metrics.jsonl and samples.jsonl.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import hostile_reward_source
import pytest
import ray

from orchestration.config.files import load_config
from orchestration.metrics import read_metrics
from tasks import PromptStream, setup_dataset
from tasks.render import PromptRenderer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "your_own_task_smollm2_cpu.yaml"
HOSTILE = '''
import os, resource, signal, time

def daemon(prompts, completions, **kwargs):
    """Starts a grandchild in a session of its own that sleeps on, as a daemonising library would."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(10**6)
        os._exit(0)
    os.wait()
    return [1.0] * len(completions)
''' + hostile_reward_source.HOSTILE
HANGS = ("fork_bomb", "pause_ignoring_sigterm", "gil_loop")
EXAMPLE = "examples.your_own_task.my_rewards"
# The daemon comes first: calls go out in term order, and a fork bomb takes every task the pool's user may run until
# its timeout, so the daemon must have forked before the bomb starts. With 3 workers the bomb's first call goes out
# only after 8 calls have answered, one `exits` crash among them, whose worker the pool restarts before the next
# call (about 0.4 s here); the daemon forks within milliseconds of its call. 2 s timeout: the 6 hanging calls of a
# scoring cost two rounds of 2 s. `calls_out` comes last, so the calls before the bomb are the ones counted above
# (placed before the hostile ones, it shifted an `exits` call into the bomb's round: a timeout instead of a crash).
TERMS = ('rewards.terms=[{fn: "hostile_rewards:daemon"}, '
         f'{{fn: "{EXAMPLE}:correct_answer"}}, {{fn: "{EXAMPLE}:brevity", weight: 0.5, params: {{max_chars: 8}}}}, '
         + ", ".join(f'{{fn: "hostile_rewards:{name}"}}' for name in ("raises", "exits", *HANGS))
         + ', {fn: "hostile_rewards:calls_out", params: {log_to: CALLS_OUT}}]')
POOL_USER = 61234
"""The workers' uid (the tests run as root): unused elsewhere, so what is left of the pool shows as its processes,
and the fork bomb's task bound is not shared with another test's pool (rewards.pool.max_tasks counts per user)."""
STEPS = 3
TINY = ["model.path=tiny-llama", "rollout.sampling.n=4", "train.prompts_per_step=2", f"train.steps={STEPS}",
        "learner.grpo.micro_batch_size=8", "eval.every=2", "eval.prompts=4", "eval.k=2", TERMS,
        "rewards.pool.workers=3", "rewards.pool.timeout_s=2", "rewards.pool.max_tasks=16",
        f"rewards.pool.user={POOL_USER}"]


@pytest.fixture(scope="module")
def user_run(tmp_path_factory, tiny_model_dir) -> Path:
    """The example config on tiny-llama, its reward list plus two hostile rewards from a PYTHONPATH module."""
    root = tmp_path_factory.mktemp("user")
    (root / "modules").mkdir()
    (root / "modules" / "hostile_rewards.py").write_text(HOSTILE)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(root / "modules"))
    run_dir = root / "run"
    # `calls_out` says what it tried in a folder the workers' user may reach (tmp_path's parents are root's alone).
    calls = Path(tempfile.mkdtemp(prefix="aha-calls-out-"))
    calls.chmod(0o777)
    overrides = [arg.replace("CALLS_OUT", f'"{calls / "calls.jsonl"}"') for arg in TINY]
    try:
        proc = subprocess.run([sys.executable, "-m", "orchestration.cli.train", "--config", str(CONFIG),
                               "--run-dir", str(run_dir), *overrides], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=900)
        if (calls / "calls.jsonl").exists():
            shutil.copy(calls / "calls.jsonl", root / "calls_out.jsonl")
    finally:
        shutil.rmtree(calls)
    assert proc.returncode == 0, f"training exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return run_dir


def test_a_jsonl_file_and_rewards_by_import_path_train_end_to_end(user_run) -> None:
    rows = read_metrics(user_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        for key in ("reward/correct_answer", "reward/brevity", "reward/total", "learner/loss"):
            assert math.isfinite(row[key]), f"step {row['step']}: {key} = {row[key]}"
        assert -1.0 <= row["reward/brevity"] <= 0.0 and 0.0 <= row["reward/correct_answer"] <= 1.0
    # The prompts are the file's rows, drawn in the order the stream gives: the data position the checkpoint keeps.
    cfg = load_config(user_run / "config.yaml")
    stream = PromptStream(setup_dataset(cfg.data, "train"), cfg.train.prompts_per_step, cfg.data.seed)
    renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
    drawn = [json.loads(line)["prompt"] for line in (user_run / "samples.jsonl").read_text().splitlines()]
    assert drawn == [renderer.text(stream.next_batch()[0]) for _ in range(STEPS)]
    assert "Reply with the number only." in drawn[0] and "What is" in drawn[0]


def test_hostile_rewards_are_counted_in_the_metrics_while_the_run_goes_on(user_run) -> None:
    """Rewards that raise, exit, fork-bomb, pause with SIGTERM ignored and hold the GIL in C fail their calls, each
    counted by kind, and the run finishes; a setsid grandchild scores as it returns. Fails on main at 85b20f9 (as
    root the fork bomb found no task bound and refused: `raised`, not `timeout`; and see the next test)."""
    for row in read_metrics(user_run):
        groups = 2  # train.prompts_per_step: one call per prompt's group
        assert row["reward/errors/raised"] == groups and row["reward/errors/crash"] == groups, row
        assert row["reward/errors/timeout"] == len(HANGS) * groups, row
        assert row["reward/errors/memory"] == row["reward/errors/invalid"] == 0
        assert row["reward/errors"] == (2 + len(HANGS)) * groups
        assert row["reward/raises"] == row["reward/exits"] == 0.0, "a failed call scores 0 (rewards.on_error: zero)"
        assert all(row[f"reward/{name}"] == 0.0 for name in HANGS)
        assert row["reward/daemon"] == 1.0


def test_a_reward_reaches_neither_the_runs_engine_nor_anything_on_the_host(user_run) -> None:
    """`calls_out` connects, at every call of the run, to every TCP socket listening in the driver's network (its
    engine on the loopback, Ray's ports, whatever else runs here): none answers, and it scores 0. Fails on main at
    98997ee: the reward workers shared the host's network and reached all of them."""
    engine = json.loads((user_run / "summary.json").read_text())["placement"]["engines"][0]
    calls = [json.loads(line) for line in (user_run.parent / "calls_out.jsonl").read_text().splitlines()]
    assert len(calls) >= 2 * STEPS, f"calls_out ran {len(calls)} times"
    engine_at = engine.removeprefix("http://")
    assert all(engine_at in call["tried"] for call in calls), f"the run's engine {engine_at} was not tried: {calls[0]}"
    assert all(call["connected"] == [] for call in calls), [call["connected"] for call in calls]
    assert all(row["reward/calls_out"] == 0.0 for row in read_metrics(user_run))
    print(f"{len(calls)} calls, each tried {len(calls[0]['tried'])} listening sockets (the engine {engine_at} among "
          f"them) and reached none: {calls[0]['errors']}")


def test_the_run_leaves_no_process_of_its_rewards_behind(user_run) -> None:
    """After the run, no process of the workers' user is left: not the workers, not the fork bomb's copies, not the
    setsid grandchildren. Fails on main at 85b20f9 (workers ran as root; each daemon call left a grandchild)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: only a root driver runs its workers as rewards.pool.user")
    left = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except (NotADirectoryError, FileNotFoundError, ProcessLookupError):
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields["Uid"].split()[0]) == POOL_USER and not fields["State"].startswith("Z"):
            left.append(f"{entry.name} {fields['Name']}")
    assert not left, f"processes of the reward workers' user {POOL_USER} outlived the run: {left}"


def test_in_loop_eval_scores_the_held_out_rows_with_the_solved_by_reward(user_run) -> None:
    evals = [r for r in read_metrics(user_run) if "eval/reward" in r]
    assert [r["step"] for r in evals] == [2, 3]
    for row in evals:
        assert 0.0 <= row["eval/accuracy"] <= 1.0 and row["eval/accuracy_low"] <= row["eval/accuracy_high"], row
        assert math.isfinite(row["eval/reward_correct_answer"]) and math.isfinite(row["eval/reward_brevity"])


def test_a_reward_module_in_a_ray_working_dir_loads_in_the_pool(tmp_path) -> None:
    """`ray job submit --working-dir DIR` and a runtime_env working_dir unpack DIR as the worker's cwd: the pool
    started there must find the user's module (it is on no other path)."""
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "job_rewards.py").write_text("def length(prompts, completions, **kwargs):\n"
                                            "    return [float(len(c)) for c in completions]\n")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"working_dir": str(workdir)}, _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        result, cwd = ray.get(_score_in_a_ray_worker.remote())
    finally:
        ray.shutdown()
    assert result == {"length": [3.0, 1.0]}
    assert Path(cwd) != workdir and (Path(cwd) / "job_rewards.py").exists(), "not run from Ray's copy of the dir"


@ray.remote
def _score_in_a_ray_worker() -> tuple[dict, str]:
    from rewards import RewardsConfig, Sample, setup_rewards

    with setup_rewards(RewardsConfig(terms=[{"fn": "job_rewards:length"}])) as rewards:
        return rewards.score([Sample("p", "abc"), Sample("p", "d")]).per_name, os.getcwd()
