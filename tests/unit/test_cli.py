"""The `aha` console script reaches every entry point (prepare-model in the engine env, where torch is)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def aha(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_aha_help_lists_every_command():
    proc = aha("--help")
    assert proc.returncode == 0, proc.stderr
    assert all(f"  {name} " in proc.stdout for name in ("train", "serve", "eval", "preflight", "prepare-model", "tpu-check"))
    unknown = aha("bogus")
    assert unknown.returncode == 2 and "unknown command 'bogus'" in unknown.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_runs_its_entry_point(command):
    proc = aha(command, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:"), proc.stdout[:300]


def test_tinker_on_a_port_in_use_says_so_at_once_and_starts_nothing(tmp_path):
    """`aha tinker --port P` where something already listens on P: exit 2 with one line that names the port and what
    to change, before any part starts (no Ray cluster, nothing in the run dir but its config). Fails on main at
    9e6dceb (the port was bound after Ray, the learner and the engine had started: a traceback a minute later; a
    suite run's tinker test lost a port picked free to another process in that minute)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = aha("tinker", "--config", "configs/tinker_smollm2_cpu.yaml", "--run-dir", str(tmp_path / "run"),
                   "--port", str(port), "model.path=tiny-llama")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"tinker: cannot listen on 127.0.0.1:{port} (Address already in use); pass another --port, or "
                     "--port 0 for any free one"], proc.stderr[-2000:]
    assert "Ray" not in proc.stdout, proc.stdout[-2000:]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml"]


def test_tinker_on_sglang_jax_names_what_the_engine_lacks_and_starts_nothing(tmp_path):
    """`aha tinker rollout.backend.kind=sglang_jax`: exit 2 with one line naming what SGLang-JAX lacks for the service
    (one merged LoRA at a time, no prompt or top-k logprobs) and the fix, before any part starts (no run dir, no
    Ray). Fails on main at fe1415a (two "unknown key" lines about the config's vLLM keys, each "did you mean" itself,
    and nothing about the engine)."""
    proc = aha("tinker", "--config", "configs/tinker_smollm2_cpu.yaml", "--run-dir", str(tmp_path / "run"),
               "rollout.backend.kind=sglang_jax")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tinker: rollout.backend.kind (sglang_jax): "), proc.stderr[-2000:]
    for lacks in ("one LoRA merged into the base weights at a time", "no prompt or top-k logprobs",
                  "rollout.backend.kind: vllm"):
        assert lacks in lines[0], (lacks, lines[0])
    assert not (tmp_path / "run").exists() and "Ray" not in proc.stdout, proc.stdout[-2000:]
