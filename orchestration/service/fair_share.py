"""Engine requests shared fairly between clients: a client that sends a thousand samples does not make another's one
sample wait behind all of them.

At most `limit` sampling requests are on the engines at once (the engines batch them: several clients' adapters
in one engine batch, up to vLLM's `max_loras`). When one finishes, the next to go is the oldest request of the
client whose turn it is, clients taking turns round-robin in the order they first asked; a client's own requests
go in the order it sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairShare:
    def __init__(self, limit: int):
        self._limit = limit
        self._running = 0
        self._waiting: OrderedDict[str, deque[asyncio.Future]] = OrderedDict()  # by client, in turn order

    @contextlib.asynccontextmanager
    async def turn(self, client: str) -> AsyncIterator[None]:
        """Hold one of the engines' request slots for the block, given in turn among the clients waiting."""
        if self._running < self._limit and not self._waiting:
            self._running += 1
        else:
            ready = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(client, deque()).append(ready)
            try:
                await ready  # the slot was handed over by the request that finished
            except asyncio.CancelledError:
                if ready.done() and not ready.cancelled():
                    self._release()  # handed over just as it was cancelled: pass it on
                else:
                    self._forget(client, ready)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            client, queue = next(iter(self._waiting.items()))
            ready = queue.popleft()
            self._waiting.pop(client)
            if queue:
                self._waiting[client] = queue  # to the back of the turn order
            if not ready.done():
                ready.set_result(None)  # the slot passes to it: the running count stays
                return
        self._running -= 1

    def _forget(self, client: str, ready: asyncio.Future) -> None:
        queue = self._waiting.get(client)
        if queue is not None and ready in queue:
            queue.remove(ready)
            if not queue:
                self._waiting.pop(client)

    @property
    def waiting(self) -> dict[str, int]:
        return {client: len(queue) for client, queue in self._waiting.items()}
