"""Reward throughput: scores per second for each reward on realistic completions.

Rewards run on the driver between generation and the learner step, so they must never show in the step profile.
The completions imitate a small model mid-training: a think block of 40-160 words of arithmetic chatter, then a
correct equation, a wrong one, a malformed one, several answer blocks, or nothing (truncated at max_tokens);
some loop on a phrase. Ratios are against the target (countdown > 20k scores/s) and measured in this one run.

    .venv/bin/python bench/bench_rewards.py [--n 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import time

from tasks import DataConfig, setup_dataset
from rewards import REWARDS, RewardsConfig, Sample, setup_rewards

COUNTDOWN_TARGET_PER_S = 20_000
FILLER = "so we need to get closer maybe try multiplying first then subtract the rest and check again".split()


def make_samples(n: int, seed: int) -> list[Sample]:
    """Countdown completions (also used for the format and repetition rewards)."""
    rng = random.Random(seed)
    prompts = setup_dataset(DataConfig(train_size=n, eval_size=1, seed=seed), "train")
    samples = []
    for prompt in prompts:
        ref = prompt.reference
        nums = ref["numbers"]
        words = []
        for _ in range(rng.randint(40, 160) // 8):
            a, b = rng.sample(nums, 2)
            words += [f"{a} {rng.choice('+-*/')} {b} = {rng.randint(1, 200)},", *rng.sample(FILLER, 5)]
        think = " ".join(words)
        kind = rng.random()
        if kind < 0.3:
            tail = f"<answer>{ref['solution']}</answer>"
        elif kind < 0.55:
            tail = f"<answer>{' + '.join(map(str, nums))}</answer>"
        elif kind < 0.7:
            tail = f"<answer>{nums[0]} * x = {ref['target']}</answer>"
        elif kind < 0.8:
            tail = f"<answer>{nums[0]}</answer> wait <answer>{ref['solution']}</answer>"
        elif kind < 0.9:
            tail = "let me try again " * rng.randint(10, 60)  # loops until max_tokens, no answer
        else:
            tail = ""
        completion = f"<think>{think}</think>\n{tail}"
        prompt_text = prompt.text or prompt.messages[-1]["content"]
        samples.append(Sample(prompt_text, completion, {**ref, "answer": str(ref["target"])}))
    return samples


def make_math_samples(n: int, seed: int) -> list[Sample]:
    """Word-problem completions: the right number, a wrong one, boxed, after ####, or no final answer."""
    rng = random.Random(seed)
    samples = []
    for prompt in setup_dataset(DataConfig(task="math", train_size=n, eval_size=1, seed=seed), "train"):
        answer = prompt.reference["answer"]
        guess = answer if rng.random() < 0.4 else str(int(answer) + rng.randint(1, 9))
        think = " ".join(rng.choice(FILLER) + f" {rng.randint(1, 99)}" for _ in range(rng.randint(10, 40)))
        tail = rng.choice([f"<answer>{guess}</answer>", f"\\boxed{{{guess}}}", f"#### {guess}", "", f"${guess}.00"])
        samples.append(Sample(prompt.messages[-1]["content"], f"<think>{think}</think>\n{tail}", prompt.reference))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="completions to score")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    samples = make_samples(args.n, args.seed)
    math_samples = make_math_samples(args.n, args.seed)
    chars = sum(len(s.completion) for s in samples) / len(samples)
    print(f"{len(samples)} countdown completions ({chars:.0f} chars), {len(math_samples)} math completions")
    rates = {}
    for name, cls in REWARDS.items():
        if name == "judge":  # a model's grade through an engine, not a function of the text: bench/bench_judge.py
            continue
        fn, batch = cls(), math_samples if name == "math_answer" else samples
        for sample in batch[:100]:  # warm caches (regex compilation)
            fn(sample)
        start = time.perf_counter()
        values = [fn(sample) for sample in batch]
        rates[name] = len(batch) / (time.perf_counter() - start)
        print(f"{name:12s} {rates[name]:10,.0f} scores/s   mean value {sum(values) / len(values):+.3f}")
    names = ["countdown", "format", "repetition"]  # the countdown recipe's terms
    rewards = setup_rewards(RewardsConfig(terms=[{"name": name} for name in names]))
    start = time.perf_counter()
    result = rewards.score(samples)
    combined = len(samples) / (time.perf_counter() - start)
    print(f"RewardSet.score({'+'.join(names)}): {combined:,.0f} samples/s, errors {len(result.errors)}")
    ratio = rates["countdown"] / COUNTDOWN_TARGET_PER_S
    print(f"countdown / target ({COUNTDOWN_TARGET_PER_S:,}/s): {ratio:.1f}x")


if __name__ == "__main__":
    main()
