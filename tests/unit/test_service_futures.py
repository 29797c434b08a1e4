"""The Tinker service's futures and per-client sequencer (orchestration/service/futures.py), on a real asyncio loop:
a refused op's number is skipped, the queue has a depth, finished jobs are forgotten; and a forward_backward
body's head (model_id, seq_id) is read from its first bytes (orchestration/service/wire.py `read_head`)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tinker.proto import tinker_public_pb2 as pb

from orchestration.service.futures import Futures, Outcome, QueueFull, Sequencer, UserError
from orchestration.service.wire import read_head


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def test_a_skipped_number_lets_the_next_op_run():
    """seq 2 refused before it was queued (skip): seq 3 runs after seq 1. On the old sequencer (no skip) seq 3
    waited for a 2 that never came, and the client's every later op hung."""

    async def scenario():
        seq, ran = Sequencer(first=1), []

        async def op(n):
            ran.append(n)
            return Outcome(json={"n": n})

        later = asyncio.create_task(seq.run(3, lambda: op(3)))
        await seq.run(1, lambda: op(1))
        await seq.skip(2)
        await later
        await seq.skip(5)  # skipped before its turn: 4 runs, then 6 follows at once
        await seq.run(4, lambda: op(4))
        await seq.run(6, lambda: op(6))
        with pytest.raises(UserError, match="already used"):
            await seq.run(5, lambda: op(5))
        return ran

    assert run(scenario()) == [1, 3, 4, 6]


def test_the_queue_has_a_depth_and_says_when_it_is_full():
    """max_pending jobs at once; one more raises QueueFull (the route answers 429, the SDK resubmits) unless it is
    a training client's sequenced op; a job done frees its place."""

    async def scenario():
        futures, gate = Futures(max_pending=2), asyncio.Event()

        async def blocked():
            await gate.wait()
            return Outcome(json={})

        first = futures.submit("sample", blocked)
        futures.submit("sample", blocked)
        assert futures.full and futures.pending == 2
        with pytest.raises(QueueFull, match="max_pending_ops"):
            futures.submit("sample", blocked)
        futures.submit("optim_step", blocked, bounded=False)  # a client's sequenced op is never refused for depth
        assert futures.pending == 3
        gate.set()
        assert (await futures.retrieve(first)).json == {}
        await asyncio.sleep(0)
        assert not futures.full
        futures.submit("sample", blocked)

    run(scenario())


def test_finished_jobs_are_forgotten_collected_or_not():
    """A delivered job goes keep_s after its delivery, an uncollected one uncollected_s after it finished (the old
    futures kept an uncollected job for ever); a pending one stays; a forgotten one is a KeyError (a 410)."""

    async def scenario():
        futures = Futures(max_pending=8, keep_s=10, uncollected_s=100)
        done = lambda: asyncio.sleep(0, Outcome(json={}))  # noqa: E731
        collected, uncollected = futures.submit("a", done), futures.submit("b", done)
        pending = futures.submit("c", asyncio.Event().wait)
        await futures.retrieve(collected)
        await asyncio.sleep(0.01)
        now = asyncio.get_running_loop().time()
        futures.prune(now + 50)
        assert collected not in futures and uncollected in futures and pending in futures
        futures.prune(now + 150)
        assert uncollected not in futures and pending in futures
        with pytest.raises(KeyError):
            await futures.retrieve(uncollected)

    run(scenario())


def test_a_forward_backward_head_is_read_from_its_first_bytes():
    """model_id and seq_id lead the SDK's serialized body, so an oversized one still names the number it gives up."""
    request = pb.ForwardBackwardRequest(model_id="s1:train:0", seq_id=300, loss_fn="cross_entropy")
    datum = request.data.add()
    datum.model_input.add().encoded_text.tokens = np.arange(100_000, dtype="<i4").tobytes()
    body = request.SerializeToString()
    assert read_head(body[:64]) == ("s1:train:0", 300)
    with pytest.raises(UserError, match="model_id and seq_id"):
        read_head(b"\xff\xff")
