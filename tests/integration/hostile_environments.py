"""Environments that fail on purpose, one way per row: `environment.name: tests.integration.hostile_environments:Hostile`.

Each row names how its episodes' step behaves (`reference["mode"]`):
- `ok`: replies and ends the episode, reward 1 for a turn of even length (so rewards vary);
- `raises`: raises ValueError;
- `sleeps`: ignores SIGTERM and waits on an event nobody sets (a plain function that never returns);
- `holds_gil`: one C call that never releases the GIL (`sum(range(10**15))`), which no thread can interrupt;
- `awaits_forever`: a coroutine step that awaits an event nobody sets;
- `close_sleeps` (not among the default rows): replies and ends the episode, then its `close` never returns.
The openings always answer. Used by tests/unit/test_environment_host.py and
tests/integration/test_environment_failures.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading

from tasks.environments.base import Message, ModelTurn, Reply
from tasks.prompt import Prompt

MODES = ("ok", "raises", "sleeps", "holds_gil", "awaits_forever")
KNOWN = (*MODES, "close_sleeps")


class Hostile:
    """One row per mode in `modes`, in both splits."""

    def __init__(self, modes: tuple[str, ...] | list[str] = MODES):
        unknown = set(modes) - set(KNOWN)
        if unknown:
            raise ValueError(f"modes {sorted(unknown)}: choose from {list(KNOWN)}")
        self.modes = tuple(modes)

    def rows(self, data, split: str) -> list[Prompt]:
        return [Prompt(f"hostile-{split}-{i:06d}", "hostile", None, None, {"mode": mode})
                for i, mode in enumerate(self.modes)]

    def episode(self, row: Prompt):
        mode = row.reference["mode"]
        return AsyncHostileEpisode(mode) if mode == "awaits_forever" else HostileEpisode(mode)


class HostileEpisode:
    def __init__(self, mode: str):
        self.mode = mode

    def opening(self) -> list[Message]:
        return [{"role": "user", "content": f"Say one word ({self.mode})."}]

    def step(self, turn: ModelTurn) -> Reply:
        if self.mode == "raises":
            raise ValueError("hostile step")
        if self.mode == "sleeps":
            with contextlib.suppress(ValueError):  # run in a thread (in-process), it cannot set a handler
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            threading.Event().wait()
        if self.mode == "holds_gil":
            sum(range(10**15))
        return Reply(reward=float(len(turn.text) % 2 == 0), done=True, info={"ok_steps": 1})

    def close(self) -> float:
        if self.mode == "close_sleeps":
            threading.Event().wait()
        return 0.0


class AsyncHostileEpisode:
    def __init__(self, mode: str):
        self.mode = mode

    async def opening(self) -> list[Message]:
        return [{"role": "user", "content": f"Say one word ({self.mode})."}]

    async def step(self, turn: ModelTurn) -> Reply:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")
