"""Two clones on one machine share the cached envs ($AHA_CACHE) yet each imports its own code.

Each clone is set up with the README's command from another directory; then each clone's `.venv/bin/python`, a
subprocess of it and a Ray worker it starts must import that clone's `orchestration`, not the other's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

# A marker module that differs between the clones, imported three ways: here, in a child process, in a Ray worker.
PROBE = """
import subprocess, sys, ray
import orchestration.clone_mark as m
child = subprocess.run([sys.executable, "-c", "import orchestration.clone_mark as m; print(m.NAME)"],
                       capture_output=True, text=True, check=True).stdout.strip()
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
worker = ray.get(ray.remote(lambda: __import__("orchestration.clone_mark").clone_mark.NAME).remote())
ray.shutdown()
print(m.NAME, child, worker)
"""


def _clone(dest: Path, name: str, cwd: Path) -> None:
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True)
    (dest / "orchestration" / "clone_mark.py").write_text(f"NAME = {name!r}\n")
    proc = subprocess.run(["bash", str(dest / "scripts" / "setup_envs.sh")], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_two_clones_each_import_their_own_code(tmp_path):
    clones = {name: tmp_path / name for name in ("one", "two")}
    for name, dest in clones.items():
        _clone(dest, name, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    for name, dest in clones.items():
        out = subprocess.run([str(dest / ".venv" / "bin" / "python"), "-c", PROBE], cwd="/", env=env,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split()[-3:] == [name, name, name]
    # One shared env under both overlays: the second setup reused the first one's build.
    shared = {os.path.realpath(next((d / ".venv").glob("lib/python3.*/site-packages/_aha_overlay.pth")).read_text()
                               .split("addsitedir(")[1].strip(")'\n")) for d in clones.values()}
    assert len(shared) == 1
