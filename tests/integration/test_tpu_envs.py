"""The TPU environments that `bash scripts/setup_envs.sh --tpu` builds on a TPU VM, checked from this CPU box.

- The learner's TPU env (requirements/learner-tpu.lock: jax[tpu], which brings libtpu) installs here: it is wheels
  only. Built once per lock into $AHA_CACHE like every env; libtpu then compiles for a TPU topology on CPU.
- The vllm-tpu engine env resolves for the TPU VM's platform (linux x86_64) from its .in file, to the engine pins the
  committed lock holds; installing it needs the TPU VM (vllm-tpu is an sdist built there). A resolve costs ~30 s of
  network, so a passing one is remembered under $AHA_CACHE/ci, keyed by the hash of every input including the
  committed lock: an edited .in, uv.toml or lock is resolved and compared again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("AHA_CACHE", Path.home() / ".cache" / "aha")).expanduser()

pytestmark = pytest.mark.integration

TOPOLOGY = """
import jax, libtpu
from jax.experimental import topologies
devices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
print(jax.__version__, len(devices), devices[0].platform)
"""


def test_learner_tpu_env_installs_and_libtpu_knows_the_topology():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_env.sh"), "learner-tpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    python = Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python"
    # libtpu takes a /tmp lockfile (one user per TPU VM); on this shared box another process may hold it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {
        "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    out = subprocess.run([str(python), "-c", TOPOLOGY], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["0.12.0.1", "4", "tpu"]


# What the TPU VM's engine is: the .in pins the first two, tpu-inference pins the rest. A lock whose pins differ from
# what its .in resolves to is stale (the .in was edited without `bash scripts/lock.sh vllm-tpu`).
ENGINE_PINS = ("vllm-tpu", "tpu-inference", "jax", "jaxlib", "libtpu")


def pins(lock_text: str) -> dict[str, str]:
    """{package: version} of the engine's packages in a lock file's `name==version` lines."""
    found = dict(line.split(" ")[0].split("==") for line in lock_text.splitlines() if "==" in line
                 and not line.startswith((" ", "#")))
    return {name: found.get(name, "missing") for name in ENGINE_PINS}


def test_vllm_tpu_env_resolves_to_the_committed_pins(tmp_path):
    lock = ROOT / "requirements" / "vllm-tpu.lock"
    inputs = [ROOT / "requirements" / "vllm-tpu.in", ROOT / "requirements" / "vllm-tpu.uv.toml",
              ROOT / "scripts" / "env_lib.sh", lock]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in inputs)).hexdigest()[:12]
    done = CACHE / "ci" / f"vllm-tpu-resolves-{key}"
    committed = pins(lock.read_text())
    assert committed["vllm-tpu"] == "0.32.0" and "missing" not in committed.values(), committed
    if not done.exists():
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "lock.sh"), "vllm-tpu"],
                              env=os.environ | {"LOCK_OUT": str(tmp_path)}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        resolved = pins((tmp_path / "vllm-tpu.lock").read_text())
        assert resolved == committed, (f"requirements/vllm-tpu.in resolves to {resolved}, the lock holds {committed}: "
                                       "re-lock with `bash scripts/lock.sh vllm-tpu`")
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(resolved))
    assert json.loads(done.read_text()) == committed
