"""Does a seeded request draw the same samples when other requests share the engine's batch?

Exact resume redraws a step with the same per-request seeds (`orchestration/loop.py`, `request_seeds`). vLLM seeds
each request's sampler, but the logits it samples from come out of batched matmuls, and whether a row's result
depends on what else is in the batch is a property of the kernels, not of vLLM's API. This measures it on the
real engine: the same seeded prompts sent one at a time (`rollout.client.max_concurrency: 1`, each prompt's n
samples alone in the engine's batch) and all at once (the default), several rounds each; every round is compared
with the first sequential one, sample by sample (token ids) and token by token (logprobs).

    .venv/bin/python bench/seed_batching.py --model smollm2-135m-instruct --rounds 3

SmolLM2 by default: the tiny random model puts almost all mass on one token, so any batching would agree.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

import numpy as np
import ray

from tasks.dataset import Prompt
from common.model_cache import model_dir
from tasks.render import PromptRenderer
from rollout.backend import setup_backend
from rollout.client import RolloutClient
from rollout.config import ClientConfig, RolloutConfig, VllmConfig
from rollout.handle import Rollout
from common.sampling import Completion, SamplingParams

TOPICS = ["a cat who learns to swim", "the moon's far side", "a lighthouse keeper", "bread rising overnight",
          "a lost umbrella", "the first snow", "a robot gardener", "an old map", "a kite in a storm", "two rivers"]


def clients(rollout: Rollout, concurrencies: tuple[int, ...]) -> dict[int, RolloutClient]:
    """A data-plane client of the rollout's server per max_concurrency (the server itself stays the actor's)."""
    wire = setup_backend(rollout.cfg.backend, rollout.model_path)  # only its payload format is used
    return {c: RolloutClient(rollout.base_url, ClientConfig(max_concurrency=c), wire) for c in concurrencies}


def draw(client: RolloutClient, prompts: list[list[int]], params: SamplingParams,
         seeds: list[int]) -> list[list[Completion]]:
    return asyncio.run(client.generate(prompts, params, seeds=seeds))


def compare(reference: list[list[Completion]], other: list[list[Completion]]) -> tuple[float, float, float]:
    """(fraction of samples with identical token ids, of tokens with bit-equal logprobs up to the first
    divergence, max |logprob difference| over those tokens)."""
    same_samples, equal_tokens, tokens, gap = 0, 0, 0, 0.0
    for group_a, group_b in zip(reference, other):
        for a, b in zip(group_a, group_b):
            same_samples += a.token_ids == b.token_ids
            shared = 0
            while shared < min(len(a.token_ids), len(b.token_ids)) and a.token_ids[shared] == b.token_ids[shared]:
                shared += 1
            la, lb = np.asarray(a.logprobs[:shared]), np.asarray(b.logprobs[:shared])
            equal_tokens += int(np.sum(la == lb))
            tokens += shared
            gap = max(gap, float(np.max(np.abs(la - lb)))) if shared else gap
    samples = sum(len(g) for g in reference)
    return same_samples / samples, equal_tokens / max(tokens, 1), gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    path = model_dir(args.model)
    renderer = PromptRenderer(path)  # the model's own chat template, as the training loop renders prompts
    asks = [{"role": "user", "content": f"Write two sentences about {TOPICS[i % len(TOPICS)]}."}
            for i in range(args.prompts)]
    prompts = [renderer.encode(Prompt(f"seed-batching-{i}", "chat", (ask,), None, {})) for i, ask in enumerate(asks)]
    seeds = [1000 + i for i in range(args.prompts)]
    params = SamplingParams(n=args.n, max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=True)

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=512, kv_cache_space_gb=1))
    try:
        with Rollout(cfg, path) as rollout:
            by_concurrency = clients(rollout, (1, 64))
            draw(by_concurrency[1], prompts[:1], params.model_copy(update={"max_tokens": 4}), seeds[:1])  # warm up
            reference = draw(by_concurrency[1], prompts, params, seeds)
            for r in range(args.rounds):
                for concurrency, client in by_concurrency.items():
                    samples, tokens, gap = compare(reference, draw(client, prompts, params, seeds))
                    print(f"round {r + 1}, max_concurrency {concurrency:>2}: identical samples {samples:.3f}, "
                          f"bit-equal logprobs {tokens:.3f} (max gap {gap:.2e}) vs the first sequential round",
                          flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
