"""Scale-out benchmark: rollout tokens/s with 1 engine replica vs 2, and learner step time with 1 JAX process vs 2.

One run, the same load for both sides of each ratio, alternating for `--rounds` rounds so a busy machine slows
both alike:
- rollout: P prompts x n samples x T tokens (ignore_eos, so every sample is exactly T tokens) through one replica's
  `Rollout.generate`, then through the `RolloutFleet` of both replicas (the same two servers all along);
- learner: the same batch stepped by one LearnerActor (1 process, `--devices` fake CPU devices) and by a
  LearnerGroup of 2 processes (`--devices` devices each, joined by jax.distributed): the step time ratio.

What 2 shared CPU cores can show: that the machinery adds little (the 2-replica fleet keeps both servers busy, the
2-process learner pays its cross-process collectives). What they cannot show: speed-up. Two engines or two JAX
processes on the same 2 cores split the same compute, so ~1.0x (or below, from the extra processes) is the
expected result here; on a TPU slice each replica and each learner process brings its own chips.

    .venv/bin/python bench/bench_scaleout.py --model tiny-llama --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from learner.batch import TrainBatch
from learner.config import LearnerConfig
from common.model_cache import TINY, model_dir
from rollout.config import RolloutConfig, VllmConfig
from rollout.fleet import RolloutFleet
from common.sampling import SamplingParams


def tokens_per_s(generate, prompts: list[list[int]], params: SamplingParams) -> float:
    t0 = time.perf_counter()
    groups = generate(prompts, params)
    elapsed = time.perf_counter() - t0
    return sum(len(c.token_ids) for g in groups for c in g) / elapsed


def rollout_ratio(path: Path, args) -> tuple[float, float]:
    """(median tokens/s on 1 replica, on 2) for the same load."""
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, kv_cache_space_gb=1), replicas=2)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, size=args.prompt_len)] for _ in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    with RolloutFleet(cfg, path) as fleet:
        one = fleet.replicas[0].rollout
        fleet.generate(prompts[:2], params.model_copy(update={"max_tokens": 8}))  # warm both servers
        for r in range(args.rounds):
            single, double = tokens_per_s(one.generate, prompts, params), tokens_per_s(fleet.generate, prompts, params)
            rows.append((single, double))
            print(f"rollout round {r + 1}: 1 replica {single:.1f} tok/s, 2 replicas {double:.1f} tok/s, "
                  f"ratio {double / single:.3f}", flush=True)
        print(f"fleet metrics: {fleet.metrics()}", flush=True)
    return tuple(statistics.median(x) for x in zip(*rows))


def toy_batch(rows: int, seed: int) -> TrainBatch:
    """Random token ids and rewards (a stand-in batch: step time depends on shapes, not on the text)."""
    rng = np.random.default_rng(seed)
    comps = [list(rng.integers(3, 49000, 48)) for _ in range(rows)]
    return TrainBatch([list(rng.integers(3, 49000, 16)) for _ in range(rows)], comps,
                      [list(-rng.random(48) - 1) for _ in range(rows)], rng.random(rows),
                      np.repeat(np.arange(rows // 4), 4))


def learner_ratio(path: Path, args) -> tuple[float, float]:
    """(median step seconds with 1 process, with 2 processes) on the same batch."""
    from learner.handle import LearnerHandle

    options = {"num_cpus": 0, "runtime_env": {"env_vars": {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}", "JAX_PLATFORMS": "cpu"}}}
    base = {"seq_bucket": 64, "grpo": {"micro_batch_size": args.rows}}
    one = LearnerHandle.start(LearnerConfig.model_validate(base), path, actor_options=options)
    two = LearnerHandle.start(LearnerConfig.model_validate({**base, "hosts": 2}), path, actor_options=options)

    def step(learner: LearnerHandle) -> dict[str, float]:
        update = learner.forward_backward(batch, "grpo")
        return {**update.result(), **learner.optim_step().result()}

    batch = toy_batch(args.rows, 0)
    for learner in (one, two):  # compile
        step(learner)
    rows = []
    for r in range(args.rounds):
        single = step(one)["learner/step_s"]
        double = step(two)["learner/step_s"]
        rows.append((single, double))
        print(f"learner round {r + 1}: 1 process {single:.3f} s, 2 processes {double:.3f} s, "
              f"ratio {double / single:.3f}", flush=True)
    two.kill()
    one.kill()
    return tuple(statistics.median(x) for x in zip(*rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=TINY, help="prepared model name or HF folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--rows", type=int, default=16, help="learner batch rows")
    p.add_argument("--devices", type=int, default=1, help="fake CPU devices per learner process")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip", choices=["rollout", "learner"], help="measure only the other part")
    args = p.parse_args()
    path = Path(args.model) if Path(args.model).exists() else model_dir(args.model)

    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        if args.skip != "rollout":
            single, double = rollout_ratio(path, args)
            print(f"rollout tokens/s, 2 replicas / 1 replica: {double / single:.3f} (median {double:.1f} vs "
                  f"{single:.1f} tok/s; load {args.prompts} prompts x n={args.n} x {args.max_tokens} tokens)")
        if args.skip != "learner":
            single, double = learner_ratio(path, args)
            print(f"learner step time, 2 processes / 1 process: {double / single:.3f} (median {double:.3f} s vs "
                  f"{single:.3f} s; {args.rows} rows, {args.devices} device(s) per process)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
