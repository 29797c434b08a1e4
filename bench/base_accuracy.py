"""Base held-out accuracy of a model on candidate demo tasks and prompts: one vLLM server, several candidates.

For choosing the CPU demo's task (base accuracy around 10-40%, so GRPO groups have both right and wrong samples)
and its prompt (no copyable placeholder or example answer). Also prints what trivial answer policies score on the
same prompts ("always add all numbers"), the floor a collapsed policy reaches without reading the puzzle.

    flock /tmp/aha-heavy.lock env PYTHONPATH=$PWD .venv/bin/python bench/base_accuracy.py --prompts 64 --k 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
import time
from pathlib import Path

import numpy as np

from orchestration.report import stats
from orchestration.config.files import load_config
from orchestration.evaluation import score_policy
from tasks.heldout import eval_prompts, eval_sampling

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "countdown_smollm2_cpu.yaml"
# The prompt before issue 12 ("current" style): a placeholder and an example answer the model copies.
OLD_SYSTEM = ("You are a helpful assistant. Think step by step, then answer, in exactly this format:\n"
              "<think>\n...\n</think>\n<answer>\n...\n</answer>")
OLD_COUNTDOWN = ("Using the numbers {numbers}, create an equation that equals {target}. You can use + - * / and each "
                 "number exactly once. Show your reasoning in <think> </think> and give only the equation in "
                 "<answer> </answer>, e.g. <answer>(1 + 2) / 3</answer>.")
TAGGED_SUFFIX = " Show your reasoning in <think> </think> and give only the equation in <answer> </answer>."
# The answer is the completion's first line: no tags (SmolLM2-135M almost never closes one), `= TARGET` allowed.
LINE_SYSTEM = 'data.system_prompt="You are a helpful assistant. Reply with one line: the equation, nothing else."'
LINE = ['data.assistant_prefix=""', 'rollout.sampling.stop=["\\n"]', "rollout.sampling.extra={}",
        "rewards.terms=[{name: countdown, params: {answer_tag: null, equals_target: true, format_score: 0.0, "
        "unreadable_score: 0.0}}]"]
SMALL_TRAIN = "data.train_size=2000"  # small puzzle spaces cannot fill the default 10000 distinct train puzzles
# The think-then-answer-in-tags setup the demo had before it took the answer line (each candidate states it in full,
# so a later change to the demo config does not change what a candidate measures).
TAGS = ["data.system_prompt=null", 'data.assistant_prefix="<think>\\n"', 'rollout.sampling.stop=["</answer>"]',
        "rollout.sampling.extra={include_stop_str_in_output: true}",
        "rewards.terms=[{name: format, weight: 0.5}, {name: countdown, params: {unreadable_score: 0.0}}]"]
ANSWER_PREFIX = [*TAGS, "data.assistant_prefix=<answer>"]  # the turn opens the answer block; no thinking
CD2_N50 = ["data.countdown_numbers=[2,2]", "data.max_number=50"]
CD23_N10 = ["data.countdown_numbers=[2,3]", "data.max_number=10", SMALL_TRAIN]
CANDIDATES = {  # name: (overrides, prompt style); every one has >= 200 distinct held-out puzzles
    "cd2-n50-current": ([*CD2_N50, *TAGS], "current"),
    "cd2-n50-plain": ([*CD2_N50, *TAGS], "plain"),
    "cd23-n10-current": ([*CD23_N10, *TAGS], "current"),
    "cd23-n10-plain": ([*CD23_N10, *TAGS], "plain"),
    "cd3-n10-plain": (["data.countdown_numbers=[3,3]", "data.max_number=10", SMALL_TRAIN, *TAGS], "plain"),
    "cd23-n20-plain": (["data.countdown_numbers=[2,3]", "data.max_number=20", *TAGS], "plain"),
    "cd23-n10-tagged": ([*CD23_N10, *TAGS], "tagged"),
    "cd23-n10-base": ([*CD23_N10, *TAGS, "data.template=base"], "plain"),
    "cd23-n10-answer": ([*CD23_N10, *ANSWER_PREFIX], "plain"),
    "cd2-n50-answer": ([*CD2_N50, *ANSWER_PREFIX], "plain"),
    "cd23-n10-line": ([*CD23_N10, LINE_SYSTEM, *LINE], "plain"),
    "cd2-n50-line": ([*CD2_N50, LINE_SYSTEM, *LINE], "plain"),  # the demo's setup
    "math-plain": (["data.task=math", *TAGS, "rewards.terms=[{name: format, weight: 0.5}, {name: math_answer}]"],
                   "plain"),
}


def restyle(prompt, style: str):
    """"plain": the prompt as tasks renders it now; "current": the pre-issue-12 countdown prompt;
    "tagged": today's prompt with the tag instruction repeated in the user turn (no example, no placeholder)."""
    if style == "plain" or prompt.task != "countdown":
        return prompt
    ref = prompt.reference
    if style == "tagged":
        system, user = prompt.messages
        user = {**user, "content": user["content"] + TAGGED_SUFFIX}
        return dataclasses.replace(prompt, messages=(system, user))
    user = OLD_COUNTDOWN.format(numbers=ref["numbers"], target=ref["target"])
    return dataclasses.replace(prompt, messages=({"role": "system", "content": OLD_SYSTEM},
                                                 {"role": "user", "content": user}))


def content_solved(text: str, reference: dict) -> bool:
    """Does any `... = ...` side or line of the text, tags or not, use the numbers once and hit the target?

    Says whether the model ever computes a right answer before it has learned the answer format: signal that GRPO
    can amplify once the format reward has taught the tags.
    """
    from rewards.countdown import score

    pieces = [m.strip() for part in text.split("=") for m in re.findall(r"[\d\s+\-*/().]+", part)]
    return any(score(f"<answer>{p}</answer>", reference["numbers"], reference["target"]) == 1.0 for p in pieces if p)


def trivial_floor(prompts) -> float:
    """Accuracy of answering `a + b (+ c)` to every countdown puzzle."""
    if prompts[0].task != "countdown":
        return float("nan")
    return float(np.mean([sum(p.reference["numbers"]) == p.reference["target"] for p in prompts]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidates", nargs="*", default=list(CANDIDATES))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--greedy", action="store_true", help="also score temperature 0, k = 1")
    p.add_argument("--out", type=Path, default=Path("runs/base_accuracy.jsonl"))
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import ray

    from tasks.render import PromptRenderer
    from rewards.registry import setup_rewards
    from rollout.handle import Rollout

    cfg0 = load_config(CONFIG)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ray.init(address="local", include_dashboard=False, num_cpus=2)
    try:
        with Rollout(cfg0.rollout, cfg0.model.resolved_path) as rollout:
            for name in args.candidates:
                overrides, style = CANDIDATES[name]
                cfg = load_config(CONFIG, overrides)
                renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
                prompts = [restyle(q, style) for q in eval_prompts(cfg.data, args.prompts)]
                settings = [(args.temperature, args.k)] + ([(0.0, 1)] if args.greedy else [])
                for temperature, k in settings:
                    t0 = time.perf_counter()
                    params = eval_sampling(cfg.rollout.sampling, k, temperature, args.max_tokens)
                    s = score_policy(rollout, renderer, setup_rewards(cfg.rewards), prompts, params)
                    ivs = stats.solved_intervals(s.solved)
                    row = {"candidate": name, "style": style, "overrides": overrides, "temperature": temperature,
                           "k": k, "max_tokens": args.max_tokens, "prompts": len(prompts),
                           **{key: iv.as_dict() for key, iv in ivs.items()},
                           **{f"reward/{n}": float(v.mean()) for n, v in s.per_name.items()},
                           "len_mean": float(s.lengths.mean()), "always_add": trivial_floor(prompts),
                           "content_acc": float(np.mean([content_solved(t, q.reference) for q, g in zip(prompts, s.texts)
                                                         for t in g])) if prompts[0].task == "countdown" else None,
                           "seconds": round(time.perf_counter() - t0, 1), "examples": [g[0] for g in s.texts[:4]],
                           "samples": [t for g in s.texts for t in g][:64]}
                    with args.out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"{name:<18} T={temperature} k={k} acc {ivs['accuracy']}  pass@{k} {ivs[f'pass@{k}']}  "
                          f"content {row['content_acc']}  always-add {row['always_add']:.3f}  len {row['len_mean']:.0f}  {row['seconds']}s",
                          flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
