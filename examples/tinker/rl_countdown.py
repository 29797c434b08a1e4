"""A GRPO-style RL loop of your own, on the official Tinker SDK, against `aha tinker` (docs/tinker.md).

    aha tinker --config configs/tinker_smollm2_cpu.yaml        # prints TINKER_BASE_URL and TINKER_API_KEY
    TINKER_BASE_URL=... TINKER_API_KEY=... .venv/bin/python examples/tinker/rl_countdown.py --steps 8

Each step: sample a group of answers per Countdown puzzle from the current sampler, score them with aha's
Countdown reward, turn each group's rewards into advantages (reward minus the group's mean), and send every sampled
token with its sampler logprob and advantage to `forward_backward("importance_sampling")`; then `optim_step` and
`save_weights_and_get_sampling_client` for the next step's sampler. Nothing here is aha's loop: it is SDK code, and
any Tinker server would run it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import tinker
from tinker import types

from common.countdown import score
from tasks import DataConfig, setup_dataset

SYSTEM = "You are a helpful assistant. Reply with one line: the equation, nothing else."


@dataclass
class Step:
    reward: float
    loss: float
    sampler: tinker.SamplingClient


def puzzles(count: int, seed: int = 0) -> list[tuple[list[int], int, str]]:
    """(numbers, target, question) of Countdown puzzles with two numbers of 1-50 (the demo's task)."""
    rows = setup_dataset(DataConfig(task="countdown", countdown_numbers=(2, 2), max_number=50, seed=seed,
                                    train_size=count), "train")
    return [(r.reference["numbers"], r.reference["target"], r.messages[-1]["content"]) for r in rows]


def prompt_tokens(tokenizer, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def rl_step(training: tinker.TrainingClient, sampler: tinker.SamplingClient, tokenizer, batch, group: int,
            params: types.SamplingParams, adam: types.AdamParams) -> Step:
    """One step of the loop above on `batch` (puzzles); returns the mean reward, the loss and the next sampler."""
    prompts = [prompt_tokens(tokenizer, q) for _, _, q in batch]
    futures = [sampler.sample(types.ModelInput.from_ints(p), group, params) for p in prompts]
    data, rewards = [], []
    for (numbers, target, _), prompt, future in zip(batch, prompts, futures):
        samples = future.result().sequences
        scores = np.array([score(tokenizer.decode(s.tokens, skip_special_tokens=True).strip(), numbers, target,
                                 format_score=0.0, answer_tag=None, equals_target=True) for s in samples])
        rewards.extend(scores)
        for s, advantage in zip(samples, scores - scores.mean()):
            if advantage == 0.0:
                continue  # a group whose samples all scored alike teaches nothing
            tokens = prompt + s.tokens
            data.append(types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:],
                                "logprobs": [0.0] * (len(prompt) - 1) + list(s.logprobs),
                                "advantages": [0.0] * (len(prompt) - 1) + [float(advantage)] * len(s.tokens)}))
    loss = 0.0
    if data:
        loss = training.forward_backward(data, "importance_sampling").result().metrics["loss:sum"]
        training.optim_step(adam).result()
    return Step(float(np.mean(rewards)), loss, training.save_weights_and_get_sampling_client())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-model", default="smollm2-135m-instruct")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--puzzles", type=int, default=4, help="puzzles per step")
    p.add_argument("--group", type=int, default=8, help="samples per puzzle")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--rank", type=int, default=16)
    args = p.parse_args()
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=args.base_model, rank=args.rank, seed=0)
    tokenizer = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=32, temperature=0.7, stop=["\n"], seed=0)
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.99, eps=1e-8)
    data = puzzles(args.steps * args.puzzles)
    for step in range(args.steps):
        batch = data[step * args.puzzles:(step + 1) * args.puzzles]
        out = rl_step(training, sampler, tokenizer, batch, args.group, params, adam)
        sampler = out.sampler
        print(f"step {step + 1}/{args.steps} | reward {out.reward:.3f} | loss {out.loss:.3f}", flush=True)


if __name__ == "__main__":
    main()
