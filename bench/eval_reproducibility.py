"""Does an eval draw the same samples, to the bit, from two fresh engines? One figure per way of sending it.

`aha eval` starts its own engine, so two runs of one eval are two fresh engines given the same requests. This
draws the demo's first held-out puzzles (its config, k samples each, the eval's request seeds: tasks/heldout.py
`eval_seeds`) through a fresh engine per pass, and compares every pass with the first, sample by sample (text) and
token by token (logprobs, while the tokens agree). The ways (`--ways`, each `[seeded-|unseeded-]N[w]`):

    unseeded-16   the eval before it seeded its requests: batches of 16 prompts, sent at once, each awaited
    seeded-16     the same with request seeds
    seeded-1      one prompt (its k samples) at a time
    seeded-16w    batches of 16 the engine runs whole (rollout/engine_ext/aha_vllm_whole_batches.py): `aha eval`'s way

    .venv/bin/python bench/eval_reproducibility.py --prompts 48 --passes 2

It also prints each way's generation seconds per pass (the engine's start excluded) and how the first pass of each
other seeded way compares with seeded-16w's (the same seeds, other engine steps).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

import ray

from common.sampling import Completion
from orchestration.config.files import load_config
from orchestration.config.schema import part_config
from rollout.capabilities import whole_batch
from rollout.config import RolloutConfig
from rollout.handle import Rollout
from tasks.heldout import eval_prompts, eval_sampling, eval_seeds
from tasks.render import PromptRenderer

ROOT = Path(__file__).resolve().parents[1]


def compare(a: list[list[Completion]], b: list[list[Completion]]) -> str:
    """Texts that differ, samples with any logprob difference while their tokens agree, the largest difference."""
    texts = logprob_samples = 0
    gap = 0.0
    for ga, gb in zip(a, b):
        for x, y in zip(ga, gb):
            texts += x.text != y.text
            shared = 0
            while shared < min(len(x.token_ids), len(y.token_ids)) and x.token_ids[shared] == y.token_ids[shared]:
                shared += 1
            diffs = [abs(p - q) for p, q in zip(x.logprobs[:shared], y.logprobs[:shared])]
            logprob_samples += any(diffs)
            gap = max([gap, *diffs])
    samples = sum(len(g) for g in a)
    return (f"{texts} of {samples} texts differ; {logprob_samples} samples with a logprob difference "
            f"(largest {gap:.2e})")


def draw(rollout: Rollout, ids: list[list[int]], params, seeds: list[int] | None, batch: int,
         whole: bool) -> list[list[Completion]]:
    out = []
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        sent = whole_batch(params, uuid.uuid4().hex, len(chunk)) if whole else params
        out += rollout.generate(chunk, sent, seeds=None if seeds is None else seeds[start:start + len(chunk)])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "countdown_smollm2_cpu.yaml")
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--ways", nargs="+", default=["unseeded-16", "seeded-16", "seeded-1", "seeded-16w"])
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()

    cfg = load_config(args.config, args.overrides)
    renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
    ids = [renderer.encode(q) for q in eval_prompts(cfg.data, args.prompts)]
    params = eval_sampling(cfg.rollout.sampling, args.k)
    seeds = eval_seeds(cfg.data.seed, len(ids))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    firsts = {}
    try:
        for way in args.ways:
            seeded, size = way.split("-")
            whole, batch = size.endswith("w"), int(size.rstrip("w"))
            passes = []
            for n in range(args.passes):
                with Rollout(part_config(cfg.rollout, RolloutConfig), cfg.model.resolved_path,
                             cfg.rollout.resources.ray_options()) as rollout:
                    t0 = time.perf_counter()
                    passes.append(draw(rollout, ids, params, seeds if seeded == "seeded" else None, batch, whole))
                    print(f"{way} pass {n + 1}: {time.perf_counter() - t0:.1f} s", flush=True)
            for n, other in enumerate(passes[1:], 2):
                print(f"{way}, pass {n} vs pass 1: {compare(passes[0], other)}", flush=True)
            firsts[way] = passes[0]
    finally:
        ray.shutdown()
    for way in [w for w in args.ways if w.startswith("seeded-") and w != "seeded-16w" and "seeded-16w" in firsts]:
        print(f"{way} vs seeded-16w (first passes): {compare(firsts['seeded-16w'], firsts[way])}")


if __name__ == "__main__":
    main()
