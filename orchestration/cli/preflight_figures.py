"""`aha preflight --refresh-figures`: remake the shipped TPU figures (configs/preflight_figures/).

A TPU compile costs one to three CPU-minutes here, and the suite checks every shipped TPU config (its 2- and 3-layer
probe and its whole model): on a fresh machine that was most of the suite's extra time. So the figures of those
programs ship with the code, each entry keyed by a hash of its program, devices, compiler build and flags
(learner/compiled_figures.py). A change to the learner step, jax or libtpu, or a shipped config changes the programs:
the preflight tests then name the pieces that are not shipped, and this command remakes them. It runs every shipped
TPU config's preflight (probe and whole model), each as its own process (`--jobs` at once), compiling only the
pieces the folder lacks, then removes the entries no shipped config used. Commit the folder afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from learner.compiled_figures import FLAG_VARIABLES, SHIPPED
from orchestration.config.files import load_config

REPO = Path(__file__).resolve().parents[2]


def shipped_tpu_configs() -> list[Path]:
    """The shipped GRPO configs whose learner compiles for a TPU topology (tinker_* configs are services)."""
    configs = sorted(p for p in (REPO / "configs").glob("*.yaml") if not p.name.startswith("tinker_"))
    return [c for c in configs if load_config(c).learner.topology not in (None, "cpu")]


def refresh(jobs: int) -> int:
    """Preflight every shipped TPU config (probe and whole model) into the shipped folder, then prune it."""
    SHIPPED.mkdir(parents=True, exist_ok=True)
    before = {p.stem for p in SHIPPED.glob("*.json")}
    runs = [(config, probe) for probe in (True, False) for config in shipped_tpu_configs()]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        configs, probes = zip(*runs)
        keys = [Path(tmp) / f"{i}.keys" for i in range(len(runs))]
        failed = [line for line in pool.map(_one, configs, probes, keys) if line]
        if failed:
            print("\n".join(failed), file=sys.stderr)
            print("preflight: --refresh-figures: nothing removed (a preflight failed)", file=sys.stderr)
            return 1
        used = {key for f in Path(tmp).glob("*.keys") for key in f.read_text().split()}
    gone = [p for p in SHIPPED.glob("*.json") if p.stem not in used]
    for p in gone:
        p.unlink()
    print(f"preflight: {len(used)} shipped figures for {len(runs) // 2} TPU configs in {SHIPPED.relative_to(REPO)}/ "
          f"({len(used - before)} new, {len(gone)} removed) in {time.perf_counter() - t0:.0f} s; commit the folder")
    return 0


def _one(config: Path, probe: bool, keys: Path) -> str:
    """One preflight writing the pieces the shipped folder lacks; '' or a line saying why it failed."""
    args = [sys.executable, "-m", "orchestration.cli.preflight", "--config", str(config), "--refresh-figures",
            "--used-keys", str(keys), *(["--probe-layers"] if probe else [])]
    # The compiler's flags are part of every key (learner/compiled_figures.py): shipped figures are made without any,
    # as the tests and a plain `aha preflight` run.
    env = {k: v for k, v in os.environ.items() if k not in FLAG_VARIABLES}
    out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    what = f"{config.name}{' --probe-layers' if probe else ''}"
    if out.returncode != 0 or not keys.exists():
        return f"preflight: --refresh-figures: {what} exited {out.returncode}: " + (out.stdout + out.stderr)[-2000:]
    print(f"preflight: {what}: {out.stdout.strip().splitlines()[-1]}", flush=True)
    return ""
