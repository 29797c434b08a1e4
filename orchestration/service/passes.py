"""Several clients' forward / forward_backward in one learner pass.

Every training client is an adapter on the one learner, whose calls run one at a time. Requests that arrive while
a pass runs (or within `api.gather_window_s` of the first) wait here; the next pass takes the oldest one and every
other waiting request of the same loss, settings and kind, one per client, up to `learner.tenant_slots`, as one
TokenBatch whose datums name their adapters (the learner runs each row through its own: learner/tenant_stack.py).
Each client gets back its own datums' logprobs and its own summed loss, what it gets alone within float32
rounding (tests/integration/test_tenant_pass.py, test_tinker_service.py). A pass that fails runs its requests
again one by one, so an error reaches only the client whose request caused it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from learner.token_batch import TokenBatch

log = logging.getLogger(__name__)


@dataclass
class PassRequest:
    adapter: str
    batch: TokenBatch
    loss: str
    config: dict[str, float] | None
    forward_only: bool
    done: asyncio.Future = field(repr=False)  # its client's answer, set when the pass that carried it ends

    @property
    def kind(self) -> tuple:
        # [N, K] targets take another program (learner/logprobs.py): such a request does not join [N] ones.
        return self.loss, tuple(sorted((self.config or {}).items())), self.forward_only, self.batch.width > 0


RunPass = Callable[[TokenBatch, str, dict[str, float] | None, bool], Awaitable[dict[str, Any]]]


class LearnerPasses:
    """Queues forward / forward_backward requests and runs them in as few learner passes as their kinds allow."""

    def __init__(self, run: RunPass, slots: int, window_s: float):
        self._run, self._slots, self._window_s = run, slots, window_s
        self._waiting: list[PassRequest] = []
        self._running = False
        self.passes = 0  # how many passes ran, and how many requests they carried: what tenant batching saved
        self.requests = 0

    async def submit(self, adapter: str, batch: TokenBatch, loss: str, config: dict[str, float] | None,
                     forward_only: bool) -> dict[str, Any]:
        """{"loss": this client's summed loss, "logprobs": per datum} once the pass that carried it has run."""
        request = PassRequest(adapter, batch, loss, config, forward_only, asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        self._start()
        return await request.done

    def _start(self) -> None:
        if not self._running and self._waiting:
            self._running = True
            asyncio.get_running_loop().create_task(self._next_pass())

    async def _next_pass(self) -> None:
        try:
            if self._window_s > 0:
                await asyncio.sleep(self._window_s)  # let clients that send at the same moment share the pass
            group = self._take()
            await self._carry(group)
        finally:
            self._running = False
            self._start()

    def _take(self) -> list[PassRequest]:
        kind, group, clients = self._waiting[0].kind, [], set()
        for request in self._waiting:
            if request.kind == kind and request.adapter not in clients and len(group) < self._slots:
                group.append(request)
                clients.add(request.adapter)
        self._waiting = [r for r in self._waiting if r not in group]
        return group

    async def _carry(self, group: list[PassRequest]) -> None:
        head = group[0]
        try:
            out = await self._run(merged(group), head.loss, head.config, head.forward_only)
        except Exception as e:  # noqa: BLE001 - handed to the requests' futures
            if len(group) == 1:
                if not head.done.done():
                    head.done.set_exception(e)
                return
            log.warning("a pass of %d clients failed (%s); running each alone", len(group), e)
            for request in group:
                await self._carry([request])
            return
        self.passes += 1
        self.requests += len(group)
        if len(group) > 1:
            log.info("learner pass of %d clients (%s)", len(group), ", ".join(r.adapter for r in group))
        start = 0
        for request in group:
            n = len(request.batch)
            if not request.done.done():
                request.done.set_result({"loss": out["adapter_loss"][request.adapter],
                                         "logprobs": out["logprobs"][start:start + n]})
            start += n


def merged(group: list[PassRequest]) -> TokenBatch:
    """The requests' datums as one batch, each datum naming its client's adapter."""
    tokens, targets, inputs, adapters = [], [], [], []
    for request in group:
        b = request.batch
        tokens += b.tokens
        targets += b.targets
        inputs += b.inputs or [{} for _ in b.tokens]
        adapters += [request.adapter] * len(b)
    return TokenBatch(tokens, targets, inputs, tuple(adapters))
