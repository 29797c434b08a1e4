"""The Tinker API's futures: work answers `{"request_id"}` at once, the client long-polls `/retrieve_future`.

A job runs as an asyncio task; its outcome is a JSON result, a protobuf body (forward_backward and sample results),
or a failure `{"error", "category"}` (the SDK raises RequestFailedError). `retrieve` holds a poll open until the
job is done or `POLL_S` passed (the client re-polls at once after `try_again`, with a 45 s read timeout), and keeps
an outcome for `KEEP_S` after it is first delivered (a client may poll again after a dropped connection) and
`UNCOLLECTED_S` after it finished if nobody asked (a client that went away): then the job is forgotten, and a poll
for it is answered as for a job the server never knew.
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
UNCOLLECTED_S = 3600.0
PRUNE_EVERY_S = 5.0


class UserError(ValueError):
    """The request cannot be done as asked (a bad input, an unknown loss, a superseded sampler): category "user"."""


class QueueFull(RuntimeError):
    """More jobs are pending than the server takes (service.max_pending_ops): answered 429, which the SDK retries."""


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
    finished_at: float | None = None
    delivered_at: float | None = None


class Futures:
    """request_id -> job; each job's work runs once, in the order the caller submits or sequences it.

    Past `max_pending` jobs waiting or running a new bounded one raises QueueFull (the route answers 429 and the SDK
    resubmits with backoff), and a poll of a waiting job meanwhile says `paused_capacity`. A training client's
    sequenced ops are not bounded: one refused would hold up the client's later ops if the SDK stopped resending
    it (it gives up after 5 minutes), and the client's own order already limits them."""

    def __init__(self, max_pending: int, keep_s: float = KEEP_S, uncollected_s: float = UNCOLLECTED_S) -> None:
        self.max_pending, self.keep_s, self.uncollected_s = max_pending, keep_s, uncollected_s
        self._jobs: dict[str, Job] = {}
        self._pending = 0
        self._pruned_at = 0.0

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def full(self) -> bool:
        return self._pending >= self.max_pending

    def check_room(self) -> None:
        """QueueFull when `max_pending` jobs are pending already."""
        if self.full:
            raise QueueFull(f"{self._pending} operations are pending on this server (api.max_pending_ops of its "
                            "config); retry later")

    def submit(self, kind: str, work: Callable[[], Awaitable[Outcome]], bounded: bool = True) -> str:
        """Start `work` as a job; its request id. QueueFull when bounded and `max_pending` jobs are pending."""
        if bounded:
            self.check_room()
        request_id = f"{kind}-{uuid.uuid4().hex[:16]}"
        job = self._jobs[request_id] = Job(kind)
        self._pending += 1
        asyncio.get_running_loop().create_task(self._run(request_id, job, work))
        if time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
            self.prune()
        return request_id

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

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
        self._pending -= 1
        job.finished_at = time.monotonic()
        job.done.set()

    async def retrieve(self, request_id: str) -> Outcome | None:
        """The job's outcome, waiting up to POLL_S; None: not done yet (answer try_again). KeyError: not known."""
        job = self._jobs.get(request_id)
        if job is None:
            raise KeyError(request_id)
        try:
            await asyncio.wait_for(job.done.wait(), POLL_S)
        except TimeoutError:
            return None
        job.delivered_at = job.delivered_at or time.monotonic()
        return job.outcome

    def prune(self, now: float | None = None) -> None:
        """Forget jobs delivered more than keep_s ago and jobs finished but uncollected for uncollected_s."""
        now = time.monotonic() if now is None else now
        self._pruned_at = now
        for request_id in [r for r, j in self._jobs.items() if self._expired(j, now)]:
            del self._jobs[request_id]

    def _expired(self, job: Job, now: float) -> bool:
        if job.delivered_at is not None:
            return now - job.delivered_at > self.keep_s
        return job.finished_at is not None and now - job.finished_at > self.uncollected_s


class Sequencer:
    """Runs one training client's operations strictly in `seq_id` order, whatever order they arrive in.

    The SDK numbers every op of a training client (forward_backward chunks, optim_step, saves) and may send a call's
    chunks concurrently, first chunk last; the learner must see them in order. A failed op still advances the
    sequence (the SDK's client goes on after a failure), and so does an op refused before it was queued (`skip`):
    otherwise every later op of the client would wait for a number that never runs."""

    def __init__(self, first: int = 1):
        self._next = first
        self._skipped: set[int] = set()
        self._turn = asyncio.Condition()

    @property
    def next(self) -> int:
        return self._next

    async def run(self, seq_id: int, work: Callable[[], Awaitable[Outcome]]) -> Outcome:
        async with self._turn:
            if seq_id < self._next or seq_id in self._skipped:
                raise UserError(f"seq_id {seq_id} was already used by this training client (next is {self._next})")
            await self._turn.wait_for(lambda: self._next == seq_id)
        try:
            return await work()
        finally:
            async with self._turn:
                self._advance(seq_id + 1)

    async def skip(self, seq_id: int) -> None:
        """`seq_id` was refused before it was queued: the ops after it go on without it."""
        async with self._turn:
            if seq_id >= self._next:
                self._skipped.add(seq_id)
                self._advance(self._next)

    def _advance(self, to: int) -> None:
        self._next = to
        while self._next in self._skipped:
            self._skipped.remove(self._next)
            self._next += 1
        self._turn.notify_all()
