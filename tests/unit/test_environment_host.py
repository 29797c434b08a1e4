"""Every environment call ends at its timeout, whatever the environment does (tasks/environments/host.py).

No engine: the episodes' calls are made as the episode driver makes them (`asyncio.wait_for` around the call), on
a real host process and real episode processes, with the hostile environments of
tests/integration/hostile_environments.py. The end-to-end runs are tests/integration/test_environment_failures.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.environments import frames
from tasks.environments.base import ModelTurn, Reply, call
from tasks.environments.catalog import setup_environment
from tasks.environments.config import EnvironmentConfig
from tasks.environments.host import EnvironmentRaised, HostedEnvironment

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "tests.integration.hostile_environments:Hostile"
TURN = ModelTurn("four", 0)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and not yet reaped by its parent, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before or while read (ESRCH on read)
        return False
    return "\nState:\tZ" not in status


def wait_gone(pids: list[int], bound_s: float = 30.0) -> list[int]:
    """The pids still running after up to `bound_s` (a killed process takes a moment to go)."""
    deadline = time.monotonic() + bound_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def hostile():
    env = setup_environment(EnvironmentConfig(name=HOSTILE))
    assert isinstance(env, HostedEnvironment)
    yield env
    env.close()


def row(env: HostedEnvironment, mode: str):
    return next(r for r in env.rows(None, "train") if r.reference["mode"] == mode)


TIMEOUT_S = 1.0
"""The timeout a call that never returns meets (a call that answers gets BOUND_S: a loaded box forks slowly)."""
BOUND_S = 60.0


async def bounded(coro, timeout_s: float = BOUND_S):
    """An environment call as the episode driver bounds it (tasks/episodes.py `_Play.env`)."""
    return await asyncio.wait_for(coro, timeout_s)


@pytest.mark.parametrize("mode", ["sleeps", "holds_gil", "awaits_forever"])
def test_a_step_that_never_returns_is_killed_at_its_timeout(hostile, mode):
    """A plain step that sleeps with SIGTERM ignored, one that loops in C holding the GIL, and a coroutine that
    awaits forever: each call ends at the timeout and takes its episode's process with it; the host goes on."""

    async def play():
        episode = hostile.episode(row(hostile, mode))
        opening = await bounded(episode.opening())
        assert opening[0]["content"] == f"Say one word ({mode})."
        with pytest.raises(TimeoutError):
            await bounded(episode.step(TURN), TIMEOUT_S)
        assert await bounded(episode.close()) is None, "a killed episode has nothing to close"
        other = hostile.episode(row(hostile, "ok"))
        await bounded(other.opening())
        reply = await bounded(other.step(TURN))
        await bounded(other.close())
        return episode.pid, reply

    started = time.monotonic()
    pid, reply = asyncio.run(play())
    print(f"\n{mode}: killed at the 1 s timeout, the next episode answered; {time.monotonic() - started:.2f} s in all")
    assert wait_gone([pid]) == [], f"the episode process of a {mode} step outlived its timeout"
    assert reply == Reply(reward=1.0, done=True, info={"ok_steps": 1})


def test_a_step_that_raises_comes_back_as_its_exception_line(hostile):
    async def play():
        episode = hostile.episode(row(hostile, "raises"))
        await bounded(episode.opening())
        try:
            await bounded(episode.step(TURN))
        finally:
            await bounded(episode.close())

    with pytest.raises(EnvironmentRaised) as err:
        asyncio.run(play())
    assert repr(err.value) == "ValueError('hostile step')"


def test_a_close_that_never_returns_is_killed_at_its_timeout():
    env = setup_environment(EnvironmentConfig(name=HOSTILE, params={"modes": ["close_sleeps"]}))

    async def play():
        episode = env.episode(env.rows(None, "train")[0])
        await bounded(episode.opening())
        assert (await bounded(episode.step(TURN))).done
        with pytest.raises(TimeoutError):
            await bounded(episode.close(), TIMEOUT_S)
        return episode.pid

    try:
        pid = asyncio.run(play())
        assert wait_gone([pid]) == [], "the episode process of a close that never returned outlived its timeout"
    finally:
        env.close()


def test_closing_the_environment_ends_its_host_and_every_episode(hostile):
    """Episodes still in a call when the environment closes (a run that ends) do not outlive it."""

    async def start():
        episodes = [hostile.episode(row(hostile, "sleeps")) for _ in range(3)]
        for episode in episodes:
            await bounded(episode.opening())
            episode.writer.write(frames.encode(("step", (TURN,))))  # a step in flight, not awaited
            await episode.writer.drain()
        return [e.pid for e in episodes]

    pids = asyncio.run(start())
    host = hostile.host.proc.pid
    assert all(alive(p) for p in pids)
    hostile.close()
    assert wait_gone([host, *pids]) == [], "the host or an episode's process outlived the environment's close"


DRIVER = """
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
from tasks.environments.catalog import setup_environment
from tasks.environments.config import EnvironmentConfig
from tasks.environments.base import ModelTurn
env = setup_environment(EnvironmentConfig(name=sys.argv[2]))
row = next(r for r in env.rows(None, "train") if r.reference["mode"] == "sleeps")

async def main():
    episode = env.episode(row)
    await episode.opening()
    print(env.host.proc.pid, episode.pid, flush=True)
    await episode.step(ModelTurn("x", 0))

asyncio.run(main())
"""


def test_a_killed_driver_takes_its_host_and_episodes_with_it():
    """SIGKILL to the driver (no atexit, no cleanup): the kernel closes its sockets; the host sees that, kills its
    episodes' process groups and exits."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(ROOT), HOSTILE], stdout=subprocess.PIPE, text=True)
    try:
        host, episode = map(int, proc.stdout.readline().split())
        assert alive(host) and alive(episode)
    finally:
        proc.kill()
        proc.wait()
    assert wait_gone([host, episode]) == [], "the host or its episode outlived the driver"


BLOCKING_CALL = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from tasks.environments.base import call

async def main():
    try:
        await asyncio.wait_for(call(time.sleep, 10**6), 0.2)
    except TimeoutError:
        print("timed out", flush=True)

asyncio.run(main())
"""


def test_an_in_process_plain_call_that_never_returns_holds_neither_the_loop_nor_the_exit():
    """`call` on a plain function (an environment object given to `play` directly, not built from the config):
    the call ends at its timeout, `asyncio.run` returns and the process exits. Fails on main at c3b0474: the call
    ran on the event loop's default executor, whose thread `asyncio.run` waits for at its end (up to 300 s on
    Python 3.12) and the interpreter then joins forever: this subprocess timed out."""
    done = subprocess.run([sys.executable, "-c", BLOCKING_CALL, str(ROOT)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "timed out", done.stderr[-2000:]
