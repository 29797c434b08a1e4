"""A server that goes silent with requests in flight is declared unreachable within rollout.client.silent_timeout_s.

The stand-in for a silent host is a plain TCP listener that accepts connections and never answers a byte (what a
host whose link went down, or whose processes are stopped, looks like to a client whose request is already sent):
no engine is involved, the client's own deadline is what is tested. The multi-node test with a real link taken down
is tests/integration/test_multinode.py's silent engine node.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from common.sampling import SamplingParams
from rollout.client import RolloutClient, ServerSilent
from rollout.config import ClientConfig, VllmConfig
from rollout.vllm_server import VllmBackend

GUARD_S = 60.0  # what the test waits at most; without the deadline the request would wait timeout_s (600 s) x 3


@pytest.fixture
def silent_listener():
    """A listening socket that accepts (the kernel does) and never reads or answers: its URL."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_requests_to_a_silent_server_end_at_the_silent_deadline_not_at_the_read_timeout(silent_listener):
    """Fails on main at c3b0474: a request in flight to a silent host waited out `timeout_s` (600 s by default) on
    each of its `max_retries` + 1 attempts, 30 minutes before the replica was declared gone."""
    cfg = ClientConfig(silent_timeout_s=0.8)  # timeout_s stays 600 s, max_retries 2
    client = RolloutClient(silent_listener, cfg, VllmBackend(VllmConfig(), "unused"))
    sent = []

    async def go():
        return await asyncio.wait_for(client.generate([[1, 2, 3]], SamplingParams(n=2, max_tokens=4),
                                                      on_sent=lambda: sent.append(1)), GUARD_S)

    with pytest.raises(ServerSilent, match=r"answered no health check .*rollout.client.silent_timeout_s = 0.8"):
        asyncio.run(go())
    assert sent == [1], "the request never went out: the deadline was not tested with a request in flight"


def test_a_cancelled_generate_ends_its_requests_before_it_closes_their_connections(silent_listener):
    """Cancelled (eval or the loop stopped by a signal), `generate` returns only after every request task ended.

    Fails before _unless_silent awaited the work it cancelled: generate closed its HTTP client while request tasks
    still ran, and one that got the concurrency gate next posted on the closed client; `aha eval` stopped by SIGTERM
    printed that task's traceback ("Cannot send a request, as the client has been closed") in CI.
    """
    cfg = ClientConfig(silent_timeout_s=60, max_concurrency=1)
    client = RolloutClient(silent_listener, cfg, VllmBackend(VllmConfig(), "unused"))
    unhandled = []

    async def go():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
        sent = asyncio.Event()
        work = asyncio.create_task(client.generate([[1, 2, 3]] * 4, SamplingParams(n=2, max_tokens=4),
                                                   on_sent=sent.set))
        await asyncio.wait_for(sent.wait(), GUARD_S)
        await asyncio.sleep(0.05)  # the first request in flight, the other three waiting at the gate
        work.cancel()
        with pytest.raises(asyncio.CancelledError):
            await work
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    left = asyncio.run(go())
    assert left == [], f"generate returned with request tasks still running: {left}"
    assert unhandled == []
