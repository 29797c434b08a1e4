"""The episode driver: multi-turn episodes of an environment, played through the engine with token ids in and out.

One group per row: the environment makes n episodes (one per GRPO sample); their shared opening is rendered with
the model's chat template and the first turns are one engine request with n samples, as a single-turn step draws
them (same seed, same samples). Then each episode goes on alone, concurrently with every other episode of the step
(there is no barrier per turn): the environment's step reads the model's turn and replies, the reply's messages are
appended as tokens (`PromptRenderer.continuation`), and the engine samples the next turn from the whole token
sequence so far, until the reply says done or a limit ends the episode.

The training sample is that interleaved sequence, built only by appending: the engine's own sampled ids (with their
logprobs) and the environment's ids, never by re-tokenising the conversation. It is a `Completion` like a
single-turn sample (common/sampling.py): its `mask` is 1 at model tokens and 0 at environment tokens (whose logprob slots hold 0.0): the learner trains on, and corrects the ratio of,
model tokens only (learner/batch.py).

Limits (`environment:`): `max_turns` model turns; `max_episode_tokens` tokens after the opening (each turn's
max_tokens is cut to what is left, and a reply that does not fit ends the episode); `step_timeout_s` per environment
call, whatever the call does: an environment built from the config plays each episode in a process of its own,
killed at the timeout (tasks/environments/host.py). A step or close that raises or times out ends its episode: its
reward is 0 and the line is logged (rewards.on_error: zero), or the step fails (fail); an opening that fails fails
the step (the group has no prompt to train on). The engine is called through the rollout handle's `generate`
(one request per turn, in a thread pool), so a dead server is restarted and a replica fleet spreads the turns as it
spreads groups.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.event_loop import run_sync
from common.sampling import Completion, EpisodeTrace, SamplingParams
from tasks.prompt import Prompt
from tasks.environments.base import Environment, Episode, ModelTurn, Reply, call
from tasks.render import PromptRenderer

log = logging.getLogger(__name__)


@dataclass
class Group:
    """A row's episodes."""

    prompt_ids: list[int]
    """The opening, rendered and tokenised (the learner's prompt)."""
    text: str
    """The opening as text."""
    samples: list[Completion]


@dataclass(frozen=True)
class Limits:
    max_turns: int
    max_episode_tokens: int
    step_timeout_s: float
    max_model_len: int
    on_error: str = "zero"


class EnvironmentFailed(RuntimeError):
    """An environment call raised or timed out (with rewards.on_error: fail, the step fails with it)."""


class _Play:
    """What every episode of one generate call shares: the engine, the renderer, the environment and the limits."""

    def __init__(self, rollout: Any, renderer: PromptRenderer, environment: Environment, params: SamplingParams,
                 limits: Limits, on_sent: Callable[[], None] | None, pool: concurrent.futures.Executor,
                 adapter: str | None):
        self.rollout, self.renderer, self.environment, self.limits = rollout, renderer, environment, limits
        self.adapter = adapter  # the served adapter every turn samples from (None: the base model)
        stop = [s for s in getattr(environment, "stop", []) if s not in params.stop]
        self.params = params.model_copy(update={"stop": [*params.stop, *stop],
                                                "max_tokens": min(params.max_tokens, limits.max_episode_tokens)})
        self.on_sent, self.pool = on_sent, pool

    async def generate(self, ids: list[int], params: SamplingParams, seed: int | None) -> list[Completion]:
        if self.on_sent is not None:
            self.on_sent, on_sent = None, self.on_sent
            on_sent()
        work = functools.partial(self.rollout.generate, [ids], params, seeds=None if seed is None else [seed],
                                 adapter=self.adapter)
        return (await asyncio.get_running_loop().run_in_executor(self.pool, work))[0]

    async def env(self, what: str, fn: Callable, *args: Any) -> Any:
        """An environment call, bounded by step_timeout_s; a failure becomes one EnvironmentFailed line."""
        timeout = self.limits.step_timeout_s
        try:
            return await asyncio.wait_for(call(fn, *args), timeout)
        except TimeoutError:
            raise EnvironmentFailed(f"{what} took longer than environment.step_timeout_s ({timeout:g} s)") from None
        except Exception as exc:  # noqa: BLE001 - an environment's bug ends its episode, not the run
            raise EnvironmentFailed(f"{what} raised {exc!r}"[:300]) from exc


def play(rollout: Any, renderer: PromptRenderer, environment: Environment, rows: Sequence[Prompt],
         params: SamplingParams, limits: Limits, seeds: list[int] | None = None,
         on_sent: Callable[[], None] | None = None, concurrency: int = 64, adapter: str | None = None) -> list[Group]:
    """params.n episodes of each row, all concurrently, every turn from the served adapter `adapter` (None: the
    base model); groups in row order."""
    pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="episode-turn")
    ctx = _Play(rollout, renderer, environment, params, limits, on_sent, pool, adapter)
    try:
        return run_sync(_play_all(ctx, rows, seeds or [None] * len(rows)))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


async def _play_all(ctx: _Play, rows: Sequence[Prompt], seeds: Sequence[int | None]) -> list[Group]:
    try:
        async with asyncio.TaskGroup() as group:  # an engine failure cancels the rest
            tasks = [group.create_task(_play_group(ctx, row, seed)) for row, seed in zip(rows, seeds)]
    except ExceptionGroup as group_error:  # callers handle our error types, not a group of them
        raise group_error.exceptions[0] from None
    return [t.result() for t in tasks]


async def _play_group(ctx: _Play, row: Prompt, seed: int | None) -> Group:
    n = ctx.params.n
    episodes = [ctx.environment.episode(row) for _ in range(n)]
    openings = await asyncio.gather(*(ctx.env(f"{row.uid}: opening", e.opening) for e in episodes))
    if any(o != openings[0] for o in openings[1:]):
        raise ValueError(f"{row.uid}: the environment's episodes of one row open differently; the opening must "
                         "depend on the row only (GRPO compares samples of one prompt)")
    prompt_ids = ctx.renderer.encode_messages(openings[0])
    first = await ctx.generate(prompt_ids, ctx.params, seed)
    samples = await asyncio.gather(*(_play_episode(ctx, row, e, prompt_ids, c, _turn_seed(seed, j))
                                     for j, (e, c) in enumerate(zip(episodes, first))))
    return Group(prompt_ids, ctx.renderer.chat_text(openings[0]), list(samples))


def _turn_seed(seed: int | None, *path: int) -> int | None:
    """The seed of a later turn of one episode: a 31-bit function of the row's request seed and (sample, turn)."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, *path]).generate_state(1)[0] >> 1)


async def _play_episode(ctx: _Play, row: Prompt, episode: Episode, prompt_ids: list[int], turn: Completion,
                        seed: int | None) -> Completion:
    """Turns until done or a limit, then the episode's `close`; the sample holds every token after the opening."""
    out = Completion(token_ids=[], logprobs=[], text="", finish_reason="", adapter=turn.adapter,
                     mask=[], episode=EpisodeTrace())
    info: Counter = Counter()
    failed = None
    try:
        await _turns(ctx, row, episode, prompt_ids, turn, seed, out, info)
    except EnvironmentFailed as exc:
        failed = exc
    except BaseException:  # the engine failed or the step was cancelled: an episode's process must not outlive it
        if hasattr(episode, "abandon"):
            episode.abandon("the step ended")
        raise
    if hasattr(episode, "close"):  # also after a failure: the environment may hold resources for the episode
        try:
            last = await ctx.env(f"{row.uid}: close", episode.close)
            out.env_reward += float(last or 0.0) if failed is None else 0.0
        except EnvironmentFailed as exc:
            failed = failed or exc
    out.episode.info = {k: float(v) for k, v in info.items()}
    if failed is not None:
        if ctx.limits.on_error == "fail":
            raise failed
        log.error("%s (episode scored 0; set rewards.on_error: fail to stop instead)", failed)
        out.episode.end = "timeout" if "took longer" in str(failed) else "error"
        out.episode.error, out.env_reward = str(failed), 0.0
    return out


async def _turns(ctx: _Play, row: Prompt, episode: Episode, prompt_ids: list[int], turn: Completion,
                 seed: int | None, out: Completion, info: Counter) -> None:
    """Append the model's turn, ask the environment, append its reply, sample the next turn; until an end.

    A turn cut by its max_tokens goes to the environment like any other (it reads hostile text anyway); its reply
    then follows the template's end-of-turn token, which the environment's ids supply."""
    while True:
        _append(out, turn.token_ids, turn.logprobs, model=True)
        out.text, out.finish_reason, out.episode.turns = turn.text, turn.finish_reason, out.episode.turns + 1
        out.episode.transcript.append({"role": "assistant", "content": turn.text})
        reply: Reply = await ctx.env(f"{row.uid}: step", episode.step, ModelTurn(turn.text, out.episode.turns - 1))
        out.env_reward += float(reply.reward)
        info.update(reply.info)
        if reply.done or out.episode.turns >= ctx.limits.max_turns:
            out.episode.end = "done" if reply.done else "max_turns"
            return
        env_ids = ctx.renderer.continuation(reply.messages, turn.token_ids[-1] if turn.token_ids else None)
        context = len(prompt_ids) + len(out.token_ids) + len(env_ids)
        room = min(ctx.limits.max_episode_tokens - len(out.token_ids) - len(env_ids),
                   ctx.limits.max_model_len - context, ctx.params.max_tokens)
        if room < 1:
            out.episode.end = "max_tokens"
            return
        _append(out, env_ids, [0.0] * len(env_ids), model=False)
        out.episode.transcript.extend(reply.messages)
        params = ctx.params.model_copy(update={"n": 1, "max_tokens": room})
        [turn] = await ctx.generate(prompt_ids + out.token_ids, params, _turn_seed(seed, out.episode.turns))


def _append(out: Completion, ids: Sequence[int], logprobs: Sequence[float], model: bool) -> None:
    out.token_ids.extend(ids)
    out.logprobs.extend(logprobs)
    out.mask.extend([int(model)] * len(ids))


def episode_metrics(samples: Sequence[Completion]) -> dict[str, float]:
    """`env/...` figures of one step's episodes."""
    tokens = sum(len(s.mask) for s in samples)
    ends = Counter(s.episode.end for s in samples)
    out = {
        "env/reward": float(np.mean([s.env_reward for s in samples])),
        "env/turns_mean": float(np.mean([s.episode.turns for s in samples])),
        "env/episode_len_mean": float(np.mean([len(s.mask) for s in samples])),
        "env/env_token_frac": float(sum(len(s.mask) - sum(s.mask) for s in samples) / max(tokens, 1)),
        "env/errors": float(ends["error"] + ends["timeout"]),
        **{f"env/end_{end}": count / len(samples) for end, count in sorted(ends.items())},
    }
    keys = sorted({k for s in samples for k in s.episode.info})
    out.update({f"env/{k}_mean": float(np.mean([s.episode.info.get(k, 0.0) for s in samples])) for k in keys})
    return out
