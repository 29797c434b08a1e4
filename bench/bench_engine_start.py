"""Engine start-up benchmark: seconds from launch to /health for a vLLM server, per variant, alternating rounds,
and the decode speed of the engine so started (milliseconds per token of a lone 32-token request).

The server is started by the project's own launcher (`rollout.vllm_server.VllmBackend.start`, no Ray), on the
tiny model, once per variant per round, alternating so a busy machine slows every side alike; each server then
answers one seeded request, and the variants must give the same text. Prints the median per variant and each one's
ratio to the first. Two comparisons:

    # an engine env with compiled bytecode against one without (scripts/env_lib.sh: an env without .pyc compiles
    # torch and vLLM from source at import)
    .venv/bin/python bench/bench_engine_start.py --python ~/.cache/aha/envs/vllm-OLD/bin/python .venv-vllm/bin/python
    # vLLM's spawned engine processes against forked ones (VllmConfig.fork_start, rollout/engine_ext/)
    .venv/bin/python bench/bench_engine_start.py --fork-start
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import requests

from common.model_cache import TINY, model_dir
from rollout.config import VllmConfig, default_engine_python
from rollout.vllm_server import VllmBackend


DECODE_TOKENS = 32


def start_and_ask(cfg: VllmConfig, model: Path) -> tuple[float, str, float]:
    """(seconds from launch to /health, the text of one seeded 8-token completion, the median milliseconds per
    token of three lone 32-token requests: the decode speed of the engine's worker as it was started)."""
    backend = VllmBackend(cfg, model)
    t0 = time.perf_counter()
    url = backend.start()
    elapsed = time.perf_counter() - t0
    try:
        body = {"model": cfg.served_model_name, "prompt": "The answer is", "max_tokens": 8, "seed": 1}
        text = requests.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
        decode = []
        for seed in range(3):
            body = {"model": cfg.served_model_name, "prompt": "Once upon a time, in a land far away,",
                    "max_tokens": DECODE_TOKENS, "ignore_eos": True, "seed": seed}
            t1 = time.perf_counter()
            requests.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status()
            decode.append((time.perf_counter() - t1) * 1000 / DECODE_TOKENS)
    finally:
        backend.stop()
    return elapsed, text, statistics.median(decode)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--python", nargs="+", help="engine interpreters to compare (first = baseline)")
    what.add_argument("--fork-start", action="store_true", help="spawned (baseline) against forked engine processes")
    p.add_argument("--model", default=TINY)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    model = model_dir(args.model)
    base = dict(max_model_len=512, kv_cache_space_gb=1)
    if args.fork_start:
        python = str(default_engine_python())
        variants = {"spawn": VllmConfig(python=python, fork_start=False, **base),
                    "fork": VllmConfig(python=python, fork_start=True, **base)}
    else:
        variants = {py: VllmConfig(python=py, **base) for py in args.python}
    times: dict[str, list[float]] = {name: [] for name in variants}
    per_token: dict[str, list[float]] = {name: [] for name in variants}
    texts: dict[str, set[str]] = {name: set() for name in variants}
    for _ in range(args.rounds):
        for name, cfg in variants.items():
            elapsed, text, ms = start_and_ask(cfg, model)
            times[name].append(elapsed)
            per_token[name].append(ms)
            texts[name].add(text)
            print(f"{name}: {elapsed:.1f} s  {ms:.1f} ms/token  {text!r}", flush=True)
    answers = set().union(*texts.values())
    print("same seeded answer from every variant" if len(answers) == 1 else f"ANSWERS DIFFER: {texts}")
    first = statistics.median(times[next(iter(variants))])
    first_ms = statistics.median(per_token[next(iter(variants))])
    for name, ts in times.items():
        median, ms = statistics.median(ts), statistics.median(per_token[name])
        print(f"median {median:.1f} s  ratio to first {median / first:.2f}  decode {ms:.1f} ms/token  ratio to "
              f"first {ms / first_ms:.2f}  {name}")


if __name__ == "__main__":
    main()
