"""SGLang-JAX beside vLLM, one run: generation tokens/s and the LoRA push pause, same load, same client.

Each engine in turn (never both at once: they would share the cores) serves the model in float32; the same
`RolloutClient` sends the same load: P prompts of L random tokens, n samples each, T tokens per sample (ignore_eos,
so every sample is exactly T tokens). A warm-up pass of the exact load comes first, because SGLang-JAX compiles every
new batch shape (tens of seconds on CPU) and vLLM warms its own caches. Prints per engine:

- tokens/s (median of `--rounds`), and the ratio SGLang-JAX / vLLM;
- the LoRA push pause (median of `--pushes`): write the PEFT adapter + load it (vLLM: hot-load; SGLang-JAX: merge
  into the weights of the running engine) + unload the previous version + the first request that uses it. This is
  the backend-level pause, without the Ray actor hop that `bench/bench_rollout.py` includes.

    .venv/bin/python bench/bench_sglang_jax.py                                # 8 prompts x n=8 x 128 tokens, SmolLM2
    .venv/bin/python bench/bench_sglang_jax.py --prompts 4 --n 4 --max-tokens 32 --rounds 1 --pushes 3
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


from bench.bench_rollout import random_adapter  # noqa: E402
from common.model_cache import SMOLLM2, model_dir  # noqa: E402
from rollout.client import RolloutClient  # noqa: E402
from rollout.config import ClientConfig, VllmConfig  # noqa: E402
from common.peft_adapter import write_adapter  # noqa: E402
from rollout.sglang_jax_config import SglangJaxConfig  # noqa: E402
from rollout.sglang_jax_server import SglangJaxBackend  # noqa: E402
from common.sampling import SamplingParams  # noqa: E402
from rollout.vllm_server import VllmBackend  # noqa: E402


def setup(kind: str, path: Path, args: argparse.Namespace, workdir: Path):
    """An unstarted backend of `kind` sized for the load."""
    context = args.prompt_len + args.max_tokens + 16
    if kind == "vllm":
        return VllmBackend(VllmConfig(max_model_len=max(context, 256), max_lora_rank=args.rank), path, workdir)
    tokens = args.prompts * args.n * context
    return SglangJaxBackend(SglangJaxConfig(max_model_len=max(context, 256), max_total_tokens=max(tokens, 4096),
                                            max_running_requests=max(args.prompts * args.n, 8)), path, workdir)


def throughput(client: RolloutClient, prompts: list[list[int]], params: SamplingParams) -> float:
    """Completion tokens/s of one pass of the load."""
    t0 = time.perf_counter()
    groups = asyncio.run(client.generate(prompts, params))
    return sum(len(c.token_ids) for g in groups for c in g) / (time.perf_counter() - t0)


def push_pauses(backend, client: RolloutClient, path: Path, args: argparse.Namespace, prompt: list[int],
                workdir: Path) -> list[float]:
    """Seconds from 'new adapter tensors in hand' to 'first token with it' for each of args.pushes versions."""
    first = SamplingParams(temperature=0.0, max_tokens=1)
    asyncio.run(client.generate([prompt], first))  # compile the 1-token shape outside the timing
    pauses, previous = [], None
    for version in range(1, args.pushes + 1):
        tensors, config = random_adapter(path, args.rank, seed=version)
        name = f"policy-v{version}"
        t0 = time.perf_counter()
        folder = write_adapter(workdir / "adapters" / name, tensors, config)
        backend.load_lora(name, folder)
        if previous is not None:
            backend.unload_lora(previous[0])
        asyncio.run(client.generate([prompt], first, name))
        pauses.append(time.perf_counter() - t0)
        if previous is not None:
            shutil.rmtree(previous[1], ignore_errors=True)
        previous = (name, folder)
    return pauses


def measure(kind: str, path: Path, args: argparse.Namespace, prompts: list[list[int]]) -> tuple[float, float]:
    """(median tokens/s, median push pause s) of one engine; its server is stopped before returning."""
    workdir = Path(tempfile.mkdtemp(prefix=f"aha-bench-{kind}-"))
    backend = setup(kind, path, args, workdir)
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, ignore_eos=True)
    try:
        t0 = time.perf_counter()
        client = RolloutClient(backend.start(), ClientConfig(), backend)
        print(f"{kind}: server up in {time.perf_counter() - t0:.0f} s", flush=True)
        t0 = time.perf_counter()
        throughput(client, prompts, params)
        print(f"{kind}: warm-up pass {time.perf_counter() - t0:.0f} s", flush=True)
        rates = []
        for r in range(args.rounds):
            rates.append(throughput(client, prompts, params))
            print(f"{kind}: round {r + 1}: {rates[-1]:.1f} tok/s", flush=True)
        pauses = push_pauses(backend, client, path, args, prompts[0], workdir)
        print(f"{kind}: push pauses {[round(p * 1000) for p in pauses]} ms", flush=True)
    finally:
        backend.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return statistics.median(rates), statistics.median(pauses)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=SMOLLM2, help="prepared model name or HF folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--pushes", type=int, default=5)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--engines", default="vllm,sglang_jax", help="comma-separated, measured in this order")
    args = p.parse_args()
    path = Path(args.model) if Path(args.model).exists() else model_dir(args.model)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, size=args.prompt_len)] for _ in range(args.prompts)]
    print(f"load: {args.prompts} prompts x n={args.n} x {args.max_tokens} tokens (prompt {args.prompt_len} tokens), "
          f"{path.name}, float32; LoRA rank {args.rank}", flush=True)
    results = {kind: measure(kind, path, args, prompts) for kind in args.engines.split(",")}
    for kind, (rate, pause) in results.items():
        print(f"{kind:>10}: {rate:8.1f} tok/s   push pause {pause * 1000:7.0f} ms")
    if {"vllm", "sglang_jax"} <= set(results):
        (v_rate, v_pause), (s_rate, s_pause) = results["vllm"], results["sglang_jax"]
        print(f"ratio sglang_jax/vllm: throughput {s_rate / v_rate:.3f}, push pause {s_pause / v_pause:.2f}")


if __name__ == "__main__":
    main()
