"""The Tinker API's futures: work answers `{"request_id"}` at once, the client long-polls `/retrieve_future`.

A job runs as an asyncio task; its outcome is a JSON result, a protobuf body (forward_backward and sample results),
or a failure `{"error", "category"}` (the SDK raises RequestFailedError). `retrieve` holds a poll open until the
job is done or `POLL_S` passed (the client re-polls at once after `try_again`, with a 45 s read timeout), and keeps
an outcome for `KEEP_S` after it is first delivered (a client may poll again after a dropped connection).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
POLL_S = 25.0
KEEP_S = 600.0


class UserError(ValueError):
    """The request cannot be done as asked (a bad input, an unknown loss, a superseded sampler): category "user"."""


@dataclass
class Outcome:
    """What `/retrieve_future` answers for a finished job."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


@dataclass
class Job:
    kind: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome | None = None
    delivered_at: float | None = None


class Futures:
    """request_id -> job; each job's work runs once, in the order the caller submits or sequences it."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def submit(self, kind: str, work: Callable[[], Awaitable[Outcome]]) -> str:
        """Start `work` as a job; its request id."""
        request_id = f"{kind}-{uuid.uuid4().hex[:16]}"
        job = self._jobs[request_id] = Job(kind)
        asyncio.get_running_loop().create_task(self._run(request_id, job, work))
        self._forget_old()
        return request_id

    async def _run(self, request_id: str, job: Job, work: Callable[[], Awaitable[Outcome]]) -> None:
        try:
            job.outcome = await work()
        except UserError as err:
            job.outcome = Outcome(error=str(err), category="user")
        except ValueError as err:  # a component's one-line refusal of the request's content
            job.outcome = Outcome(error=str(err), category="user")
        except Exception as err:  # noqa: BLE001 - a failure is the client's answer, never a dead task
            log.exception("%s %s failed", job.kind, request_id)
            job.outcome = Outcome(error=f"{type(err).__name__}: {str(err).splitlines()[0][:500]}" if str(err)
                                  else type(err).__name__, category="server")
        job.done.set()

    async def retrieve(self, request_id: str) -> Outcome | None:
        """The job's outcome, waiting up to POLL_S; None: not done yet (answer try_again)."""
        job = self._jobs.get(request_id)
        if job is None:
            raise KeyError(request_id)
        try:
            await asyncio.wait_for(job.done.wait(), POLL_S)
        except TimeoutError:
            return None
        job.delivered_at = job.delivered_at or time.monotonic()
        return job.outcome

    def _forget_old(self) -> None:
        now = time.monotonic()
        for request_id in [r for r, j in self._jobs.items() if j.delivered_at and now - j.delivered_at > KEEP_S]:
            del self._jobs[request_id]


class Sequencer:
    """Runs one training client's operations strictly in `seq_id` order, whatever order they arrive in.

    The SDK numbers every op of a training client (forward_backward chunks, optim_step, saves) and may send a call's
    chunks concurrently, first chunk last; the learner must see them in order. A failed op still advances the
    sequence (the SDK's client goes on after a failure)."""

    def __init__(self, first: int = 1):
        self._next = first
        self._turn = asyncio.Condition()

    async def run(self, seq_id: int, work: Callable[[], Awaitable[Outcome]]) -> Outcome:
        async with self._turn:
            if seq_id < self._next:
                raise UserError(f"seq_id {seq_id} was already used by this training client (next is {self._next})")
            await self._turn.wait_for(lambda: self._next == seq_id)
        try:
            return await work()
        finally:
            async with self._turn:
                self._next = seq_id + 1
                self._turn.notify_all()
