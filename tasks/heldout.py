"""The held-out eval set and scoring a policy on it: shared by `orchestration.cli.eval` and the in-loop eval.

A prompt is in the eval split by a hash of its content (tasks), so the eval prompts of *any*
`data.seed` are held out from the training prompts of every seed: `--seed` draws other held-out prompts.
A sample counts as solved when its task reward (rewards.solved_by, else countdown or math_answer) is at least 1.0,
the score of a right answer; format and repetition rewards never make a sample "solved". An episode of an
environment without such a term is solved when the environment's reward is at least 1.0 (a correct final answer, a
found number). For `data.task: dataset` the held-out rows are data.eval_path's or the data.eval_fraction held out of
data.path (tasks/row_prompts.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tasks import DataConfig, Prompt
from tasks.environments.catalog import environment_rows
from common.sampling import SamplingParams

CHUNK_PROMPTS = 16
"""Prompts per generate call: big enough to keep the engine's batch full, small enough for a moving progress bar."""


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


@dataclass
class PolicyScores:
    """Per-sample scores of one policy on the eval prompts, each array [prompts, k]."""

    totals: np.ndarray
    per_name: dict[str, np.ndarray]
    """NaN where a user's reward returned None."""
    lengths: np.ndarray
    texts: list[list[str]]
    task: str | None
    """The task reward that defines "solved" (None when the config has no task reward)."""
    episodes: dict[str, float] | None = None
    """An environment's episode figures (tasks.episodes.episode_metrics: turns, ends, tool calls, ...)."""
    transcripts: list[list[dict]] | None = None
    """Each prompt's first episode, message by message (None: single-turn)."""

    @property
    def solved(self) -> np.ndarray | None:
        return None if self.task is None else self.per_name[self.task] >= 1.0


def score_policy(rollout, renderer, rewards, prompts: Sequence[Prompt], params: SamplingParams,
                 on_progress: Callable[[int], None] | None = None, environment=None, limits=None) -> PolicyScores:
    """Generate params.n samples per prompt with the adapter now on the server and score them; with an
    `environment` (and its episode `limits`), each sample is an episode (tasks/episodes.py), its
    environment's reward logged as `env` (and "solved" when no task reward is configured).

    `on_progress(prompts_done)` is called after each chunk (a progress bar's update).
    """
    from rewards.types import Sample  # the rewards package is light; kept local so this module stays import-cheap

    if not prompts:
        raise ValueError("score_policy needs at least one prompt")
    k = params.n
    groups, texts = [], []
    for start in range(0, len(prompts), CHUNK_PROMPTS):
        chunk = prompts[start : start + CHUNK_PROMPTS]
        if environment is None:
            groups.extend(rollout.generate([renderer.encode(p) for p in chunk], params))
            texts.extend(renderer.text(p) for p in chunk)  # the chat template once per prompt, not per sample
        else:
            from tasks.episodes import play

            played = play(rollout, renderer, environment, chunk, params, limits)
            groups.extend(g.samples for g in played)
            texts.extend(g.text for g in played)
        if on_progress is not None:
            on_progress(len(chunk))
    turn = (lambda p, c: renderer.assistant_prefix + c.text) if environment is not None else \
        (lambda p, c: renderer.turn(p, c.text))
    samples = [Sample(text, turn(p, c), p.reference, c.token_ids, p.as_data)
               for p, text, g in zip(prompts, texts, groups) for c in g]
    result = rewards.score(samples, [len(g) for g in groups])
    shape = (len(prompts), k)
    per_name = {n: np.asarray(v, dtype=np.float64).reshape(shape) for n, v in result.per_name.items()}
    totals = np.asarray(result.totals, dtype=np.float64).reshape(shape)
    model_tokens = [[len(c.token_ids) for c in g] for g in groups]
    episodes = transcripts = None
    if environment is not None:
        from tasks.episodes import episode_metrics

        per_name["env"] = np.asarray([[c.env_reward for c in g] for g in groups], dtype=np.float64)
        totals = totals + per_name["env"]
        model_tokens = [[sum(c.mask) for c in g] for g in groups]
        episodes = episode_metrics([c for g in groups for c in g])
        transcripts = [g[0].transcript for g in groups]
    return PolicyScores(
        totals=totals, per_name=per_name, lengths=np.asarray(model_tokens).reshape(shape),
        texts=[[c.text for c in g] for g in groups],
        task=rewards.solved_by or ("env" if "env" in per_name else None), episodes=episodes,
        transcripts=transcripts)
