"""What an environment is: from a row, the opening messages; given the model's turn, the environment's reply.

An `Environment` makes one `Episode` per sample of a row (a GRPO group plays one row n times, each episode with its
own state). The episode driver (tasks/episodes.py) asks each episode for its opening messages, samples the
model's turn through the engine, hands the turn to `Episode.step`, and appends the `Reply`'s messages (tool results,
a user message) to the conversation as tokens, until a reply says `done` or a limit ends the episode. Rewards add
up over the replies (and `close`).

Each method may be a plain function or a coroutine function (`async def`): an environment that waits on I/O
awaits, one that computes returns. Every call runs with a timeout (`environment.step_timeout_s`). An environment
built from the config runs each episode in a process of its own (tasks/environments/host.py), killed at the timeout,
coroutines included; the verifiers adapter runs in the driver's event loop.

The model's turn is hostile input, as a completion is to a reward: parse it, never execute it.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from tasks.config import DataConfig
from tasks.prompt import Prompt

Message = dict[str, Any]
"""A chat message as the model's chat template takes it: {"role": ..., "content": ...} (a tool result may add
"name" or "tool_call_id" where the template reads them)."""

T = TypeVar("T")


@dataclass(frozen=True)
class ModelTurn:
    """One turn the model wrote, as the environment sees it."""

    text: str
    """The turn's text, detokenised by the engine (stop strings removed)."""
    index: int
    """0 for the model's first turn of the episode."""


@dataclass(frozen=True)
class Reply:
    """The environment's answer to one model turn."""

    messages: list[Message] = field(default_factory=list)
    """What the environment says next (tool results, a user message); ignored when `done`."""
    reward: float = 0.0
    """This step's contribution to the episode's reward (the contributions add up)."""
    done: bool = False
    """The episode is over: no more model turns."""
    info: dict[str, float] = field(default_factory=dict)
    """Counts to log (e.g. {"tool_calls": 1}): summed over the episode, averaged over episodes as `env/<key>`."""


class Episode(Protocol):
    """One play of one row. Optional: `close() -> float` (or a coroutine), called once when the episode ends for any
    reason (done, a limit, an error), returning a last reward contribution."""

    def opening(self) -> list[Message] | Awaitable[list[Message]]:
        """The messages before the model's first turn (system, user); the same for every episode of a row."""
        ...

    def step(self, turn: ModelTurn) -> Reply | Awaitable[Reply]:
        """The environment's reply to the model's turn."""
        ...


@runtime_checkable
class Environment(Protocol):
    """Makes episodes from rows. Optional: `rows(data, split) -> list[Prompt]`, the environment's own rows (without
    it the rows are `data.task`'s), and `stop: list[str]`, strings that end a model turn besides the sampling's own
    (e.g. a tool call's closing tag, so the model does not write the tool's result itself)."""

    def episode(self, row: Prompt) -> Episode:
        ...


def own_rows(environment: Environment, data: DataConfig, split: str) -> list[Prompt] | None:
    """The environment's own rows of `split`, or None when its rows are `data.task`'s."""
    rows = getattr(environment, "rows", None)
    return None if rows is None else list(rows(data, split))


async def call(fn: Any, *args: Any) -> Any:
    """Await `fn(*args)`: a coroutine function directly, a plain function on a daemon thread of its own.

    Not the event loop's default executor: `asyncio.run` waits for its threads when it ends, and the interpreter
    waits for them at exit, so one call that never returned held the step and then the process (issue 38). A
    cancelled call's thread runs on unobserved until it returns or the process ends; an environment built from the
    config never gets here with a plain function (its episodes run in processes: tasks/environments/host.py)."""
    import asyncio

    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome: str, value: Any) -> None:
        if not future.done():
            future.set_result(value) if outcome == "ok" else future.set_exception(value)

    def work() -> None:
        try:
            outcome, value = "ok", fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting call as it is
            outcome, value = "error", exc
        try:
            loop.call_soon_threadsafe(settle, outcome, value)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    threading.Thread(target=work, name=f"environment-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    result = await future
    return await result if inspect.isawaitable(result) else result
