"""The adapters the engines hold by name, and the ones they may be asked for again.

An engine has a limited number of LoRA slots (vLLM's --max-cpu-loras), but a sampling client may ask for its version
at any time while it lives, and the server cannot tell when a client is gone. So every version served keeps a
source (its PEFT folder on the run directory, or how to export it again), at most `capacity` are held by the engines,
and a request for one that is not held loads it again first, unloading the least recently used idle one. A name is
unloaded only while no request uses it: vLLM re-reads a registered adapter's folder after evicting it from its own
cache, and a folder deleted under a registered name kills the server (rollout/actor.py deletes it only after
unloading).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

from common.lora_adapter import LoraAdapter
from orchestration.service.futures import UserError


class ServedAdapters:
    """`add` an adapter with a source that reads it again; `use(name)` around every request for it. `serve` and
    `unserve` are the rollout handle's (rollout/protocol.py)."""

    def __init__(self, capacity: int, serve: Callable[[LoraAdapter], Awaitable[None]],
                 unserve: Callable[[str], Awaitable[None]]):
        self.capacity = capacity
        self._serve, self._unserve = serve, unserve
        self._sources: dict[str, Callable[[], Awaitable[LoraAdapter]]] = {}
        self._held: OrderedDict[str, None] = OrderedDict()  # on the engines, least recently used first
        self._busy: Counter[str] = Counter()  # requests running on each name
        self._lock = asyncio.Lock()  # one load or unload at a time, so the held set is what the engines hold

    def __contains__(self, name: str) -> bool:
        return name in self._sources

    def held(self) -> list[str]:
        """The names the engines hold now, least recently used first."""
        return list(self._held)

    async def add(self, adapter: LoraAdapter, source: Callable[[], Awaitable[LoraAdapter]]) -> None:
        """Serve `adapter` now; `source` gives it again once it has been unloaded to make room."""
        self._sources[adapter.name] = source
        async with self._lock:
            await self._make_room()
            await self._serve(adapter)
            self._held[adapter.name] = None

    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[None]:
        """Hold `name` on the engines (loading it again if it was unloaded) while the request runs."""
        if name not in self._sources:
            raise UserError(f"adapter {name!r} is not served by this server")
        if name in self._held:
            self._hold(name)
        else:
            async with self._lock:
                if name not in self._held:
                    adapter = await self._sources[name]()
                    await self._make_room()
                    await self._serve(adapter)
                    self._held[name] = None
                self._hold(name)
        try:
            yield
        finally:
            self._busy[name] -= 1

    def _hold(self, name: str) -> None:
        """Mark `name` used now (no await between a held check and this: it cannot be unloaded in between)."""
        self._held.move_to_end(name)
        self._busy[name] += 1

    async def _make_room(self) -> None:
        """Unload least recently used idle names until one more fits (with every held name busy, go one over: the
        engine's own cache reloads from the folder its actor keeps while the name is registered)."""
        while len(self._held) >= self.capacity:
            name = next((n for n in self._held if not self._busy[n]), None)
            if name is None:
                return
            del self._held[name]  # before the await: a request arriving meanwhile waits for the lock and reloads it
            await self._unserve(name)
