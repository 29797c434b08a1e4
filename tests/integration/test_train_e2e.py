"""The whole loop for real: `python -m orchestration.train` in a subprocess, which starts its own local Ray cluster,
the vLLM server (tiny model) behind the rollout actor, the JAX learner actor, and the rewards.

Assertions read metrics.jsonl and samples.jsonl, never the log text. That reward rises over a long run is shown by
the demo and its plot, not here: a few steps of a random tiny model only show the machinery is right.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestration.config import load_config
from orchestration.data import PromptStream, setup_dataset
from orchestration.metrics import read_metrics
from orchestration.prompts import PromptRenderer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "countdown_smollm2_cpu.yaml"
# The shipped demo config, shrunk to the tiny model: every step pushes a new adapter version.
TINY = ["model.path=tiny-llama", "rollout.sampling.n=4", "rollout.sampling.max_tokens=24",
        "train.prompts_per_step=2", "rollout.backend.max_model_len=512", "learner.grpo.micro_batch_size=8"]


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestration.train", *args]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_train(args: list[str], timeout_s: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(train_cmd(*args), cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, f"training exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def wait_for_rows(proc: subprocess.Popen, run_dir: Path, rows: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(read_metrics(run_dir)) < rows:
        if proc.poll() is not None:
            raise AssertionError(f"training exited ({proc.returncode}) before writing {rows} metrics rows")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {rows} metrics rows after {timeout_s} s")
        time.sleep(1)


def assert_finite_rows(rows: list[dict]) -> None:
    for row in rows:
        for key, value in row.items():
            assert not isinstance(value, str) or key in ("time",), f"step {row['step']}: {key} = {value} (not finite)"
            if isinstance(value, float):
                assert math.isfinite(value), f"step {row['step']}: {key} = {value}"


def expected_prompt_texts(run_dir: Path, steps: int) -> list[str]:
    """First prompt of each step as an uninterrupted run draws them."""
    cfg = load_config(run_dir / "config.yaml")
    stream = PromptStream(setup_dataset(cfg.data, "train"), cfg.train.prompts_per_step, cfg.data.seed)
    renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
    return [renderer.text(stream.next_batch()[0]) for _ in range(steps)]


@pytest.fixture(scope="module")
def interrupted_then_resumed(tmp_path_factory, tiny_model_dir):
    """A 6-step run interrupted (SIGINT) after >= 2 steps, then resumed to the end: (run_dir, saved step, log)."""
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    # save_every is large: the only checkpoint before the end is the one the interrupt handler writes.
    proc = subprocess.Popen(train_cmd("--config", str(CONFIG), "--run-dir", str(run_dir), *TINY,
                                      "train.steps=6", "train.save_every=100"),
                            cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_rows(proc, run_dir, 2, timeout_s=600)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, "an interrupted run must not report success"
    assert "checkpoint saved at step" in out, f"no checkpoint written on interrupt:\n{out[-3000:]}"
    saved = int(out.rsplit("checkpoint saved at step", 1)[1].split()[0])
    done = read_metrics(run_dir)
    assert 6 > saved >= len(done) >= 2, (saved, len(done))
    run_train(["--resume", str(run_dir)])
    return run_dir, saved


def test_interrupted_run_resumes_at_the_next_step_and_data_position(interrupted_then_resumed):
    run_dir, saved = interrupted_then_resumed
    rows = read_metrics(run_dir)
    resumed = [r for r in rows if r["step"] > saved]
    assert [r["step"] for r in resumed] == list(range(saved + 1, 7)), [r["step"] for r in rows]
    assert_finite_rows(rows)
    # Every step pushed a new adapter version, and the resumed run continued the numbering.
    assert [r["rollout/adapter_version"] for r in resumed] == list(range(saved + 1, 7))
    # The data position continued: each step's first prompt is the one an uninterrupted run would have drawn.
    samples = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        samples[row["step"]] = row["prompt"]
    expected = expected_prompt_texts(run_dir, 6)
    for step in range(1, 7):
        if step in samples:
            assert samples[step] == expected[step - 1], f"step {step} drew another prompt than an uninterrupted run"
    assert saved + 1 in samples, "the resumed run logged no samples for its first step"
    # The end of a run: adapter exported for serving, plots and summary written.
    assert (run_dir / "adapter" / "adapter_config.json").exists()
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()
    assert (run_dir / "plots" / "reward.png").exists()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6


def test_serve_answers_with_the_trained_adapter(interrupted_then_resumed):
    """`python -m orchestration.serve RUN_DIR` serves the run's adapter by name through the same engine."""
    import httpx

    run_dir, _ = interrupted_then_resumed
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestration.serve", str(run_dir), "--port", str(port),
                             "--name", "trained", "--api-key", "secret-key"],
                            cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise AssertionError("serve exited early:\n" + "".join(lines[-40:]))
            lines.append(line)
            if line.startswith("  curl "):
                break
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {"model": "trained", "prompt": "Using the numbers", "max_tokens": 5, "temperature": 0}
        assert httpx.post(url, json=body, timeout=60).status_code == 401, "the API key was not enforced"
        reply = httpx.post(url, json=body, headers={"Authorization": "Bearer secret-key"}, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "trained"
        assert reply.json()["choices"][0]["text"], "empty completion"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)


def engine_processes(root_pid: int):
    import psutil

    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if "vllm" in " ".join(p.cmdline()) and "--port" in p.cmdline()]


def test_run_survives_a_killed_rollout_server(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(train_cmd("--config", str(CONFIG), "--run-dir", str(run_dir), *TINY, "train.steps=3"),
                            cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_rows(proc, run_dir, 1, timeout_s=600)
    servers = engine_processes(proc.pid)
    assert servers, "no engine server process found under the training process"
    for server in servers:
        os.killpg(os.getpgid(server.pid), signal.SIGKILL)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"run did not survive a killed server:\n{out[-4000:]}"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3], "a step was lost to the server restart"
    assert sum(r["rollout/restarts"] for r in rows) >= 1, "the restart was not recorded in metrics"
    assert_finite_rows(rows)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_dashboard(head: subprocess.Popen, port: int, timeout_s: float) -> None:
    """`ray start --block` returns nothing when the cluster is up: poll the job API until it answers."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise AssertionError(f"ray start exited ({head.returncode}):\n{head.stdout.read()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/version", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise AssertionError(f"Ray dashboard on port {port} not up after {timeout_s} s")


def test_ray_job_submit_runs_two_steps(tmp_path, tiny_model_dir):
    """`ray job submit` against a cluster this test starts (own ports and temp dir, stopped by process group)."""
    venv_bin = str(Path(sys.executable).parent)
    env = clean_env() | {"PATH": venv_bin + os.pathsep + os.environ["PATH"], "RAY_USAGE_STATS_ENABLED": "0",
                         "RAY_AUTH_MODE": "disabled"}  # a private loopback cluster; Ray 2.60 defaults to token auth
    dash = free_port()
    # Ray's unix sockets live under the temp dir and their paths must stay under 108 bytes: pytest's are too long.
    ray_tmp = tempfile.mkdtemp(prefix="aha-ray-", dir="/tmp")
    head = subprocess.Popen(
        [f"{venv_bin}/ray", "start", "--head", "--block", "--num-cpus=4", f"--port={free_port()}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={ray_tmp}",
         f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
         f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
         f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
         f"--dashboard-agent-grpc-port={free_port()}", "--min-worker-port=0", "--max-worker-port=0"],
        env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = tmp_path / "run"
    try:
        wait_for_dashboard(head, dash, timeout_s=180)
        excludes = json.dumps({"excludes": [".git", ".venv", ".venv-vllm", "runs", "*.pyc"]})
        job = subprocess.run(
            [f"{venv_bin}/ray", "job", "submit", "--address", f"http://127.0.0.1:{dash}", "--working-dir", str(ROOT),
             "--runtime-env-json", excludes, "--", "python", "-m", "orchestration.train", "--config",
             "configs/countdown_smollm2_cpu.yaml", "--run-dir", str(run_dir), *TINY, "train.steps=2"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert job.returncode == 0, f"ray job submit failed:\n{job.stdout[-4000:]}\n{job.stderr[-2000:]}"
        assert "succeeded" in job.stdout.lower(), job.stdout[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert_finite_rows(rows)
