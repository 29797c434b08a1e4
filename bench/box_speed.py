"""How fast this box's cores are, in the work the suite does: CPU seconds of three fixed jobs, so that suite times
measured on different machines can be compared (docs/benchmarks.md, 2026-11-28: the modules at 3bc2dd5 and 1fc2fe3,
TPU checks aside, used 3273 core-seconds on one 2-core box and 6531 on another, where vLLM's import took 6.1 s
(`-X importtime`) and 10.4 CPU-s (this script)).

    .venv/bin/python bench/box_speed.py            # on an idle box; about a minute

The jobs, each in a fresh process, best of `--repeats` (CPU seconds, user + system, of that process alone):
- `import vllm.entrypoints.openai.api_server` in the engine env: what every engine start pays first;
- `import jax` and one jit compile of a small MLP's gradient in the learner env: what every learner process pays;
- a pure-Python loop: the interpreter alone.
A box twice as slow shows about twice the seconds in each; compare a suite's core-seconds by the ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each job prints its own CPU seconds (resource.getrusage of itself: the interpreter's start included).
CPU = "import resource; u = resource.getrusage(resource.RUSAGE_SELF); print(u.ru_utime + u.ru_stime)"
JOBS = {
    "vLLM API server import": (ROOT / ".venv-vllm" / "bin" / "python",
                               f"import vllm.entrypoints.openai.api_server\n{CPU}"),
    "JAX import + one jit compile": (ROOT / ".venv" / "bin" / "python", f"""
import jax, jax.numpy as jnp
def loss(w, x):
    for m in w:
        x = jnp.tanh(x @ m)
    return (x ** 2).sum()
w = [jnp.ones((256, 256)) * 0.01 for _ in range(8)]
jax.jit(jax.grad(loss)).lower(w, jnp.ones((64, 256))).compile()
{CPU}"""),
    "pure-Python loop (3e7 adds)": (Path(sys.executable), f"s = 0\nfor i in range(30_000_000):\n    s += i\n{CPU}"),
}


def cpu_seconds(python: Path, code: str) -> float:
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(Path.home())}
    out = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    for name, (python, code) in JOBS.items():
        if not python.exists():
            print(f"{name}: skipped, {python} missing (run scripts/setup_envs.sh)")
            continue
        runs = [cpu_seconds(python, code) for _ in range(args.repeats)]
        print(f"{name}: {min(runs):.2f} CPU s (best of {args.repeats}: {', '.join(f'{r:.2f}' for r in runs)})",
              flush=True)


if __name__ == "__main__":
    main()
