"""The held-out eval set and its sampling parameters: shared by `aha eval` and the in-loop eval (scoring a policy on
it is orchestration/evaluation.py's: it wires the engine and the rewards).

A prompt is in the eval split by a hash of its content (tasks), so the eval prompts of *any*
`data.seed` are held out from the training prompts of every seed: `--seed` draws other held-out prompts.
A sample counts as solved when its task reward (rewards.solved_by, else countdown or math_answer) is at least 1.0,
the score of a right answer; format and repetition rewards never make a sample "solved". An episode of an
environment without such a term is solved when the environment's reward is at least 1.0 (a correct final answer, a
found number). For `data.task: dataset` the held-out rows are data.eval_path's or the data.eval_fraction held out of
data.path (tasks/row_prompts.py).
"""

from __future__ import annotations

import numpy as np

from tasks import DataConfig, Prompt
from tasks.environments.catalog import environment_rows
from common.sampling import SamplingParams


def eval_prompts(data: DataConfig, limit: int, seed: int | None = None, environment=None) -> list[Prompt]:
    """The first `limit` held-out prompts for `data` (with `seed` instead of data.seed when given); the
    environment's own rows when it has them."""
    if seed is not None:
        data = data.model_copy(update={"seed": seed})
    prompts = environment_rows(data, environment, "eval")
    if limit > len(prompts):
        if data.task == "dataset" and len(prompts) < data.eval_size:
            raise ValueError(f"{limit} eval prompts asked but the held-out split has {len(prompts)} rows; ask for "
                             "fewer, or hold out more (data.eval_fraction, or a bigger data.eval_path)")
        raise ValueError(f"{limit} eval prompts asked but data.eval_size is {data.eval_size}; "
                         f"raise data.eval_size (e.g. data.eval_size={limit}) or ask for fewer")
    return list(prompts[:limit])


def eval_seeds(seed: int, count: int) -> list[int]:
    """The request seeds of the first `count` eval prompts of data seed `seed`: a 31-bit function of (seed, prompt
    index), so every eval of those prompts, base model or adapter, `aha eval` or the in-loop one, draws with the same
    seeds (the engine derives a request's n samples' seeds from it: seed + 0 .. n-1)."""
    return [int(np.random.SeedSequence([seed, i]).generate_state(1)[0] >> 1) for i in range(count)]


def eval_sampling(base: SamplingParams, k: int, temperature: float | None = None,
                  max_tokens: int | None = None) -> SamplingParams:
    """The run's sampling with n = k (and temperature / max_tokens if given), validated like the run's own."""
    update = {"n": k}
    if temperature is not None:
        update["temperature"] = temperature
    if max_tokens is not None:
        update["max_tokens"] = max_tokens
    # model_validate, not model_copy: copy skips validation, and n > 1 at temperature 0 must fail here,
    # not as a 400 from the server.
    return SamplingParams.model_validate({**base.model_dump(), **update})
