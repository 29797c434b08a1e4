"""An environment whose episodes each run in a process of their own, so that every call ends at its timeout.

The driver bounds each environment call with `environment.step_timeout_s` (tasks/episodes.py). A coroutine is
cancelled at the timeout; a plain function in a thread cannot be: a `step` that blocks (a lock, a socket without a
timeout, a C loop holding the GIL) held its thread, the step never finished and the process could not exit. So the
episodes of an environment built from the config run elsewhere: a host process builds the environment once, and
forks one process per episode (tasks/environments/host_process.py). The driver holds a `HostedEpisode` for each,
whose methods are coroutines that send the call over a socket and await the reply; when the driver's timeout
cancels one, it kills the episode's process group at once, and the episode ends as a timeout.

What stays in the driver: `HostedEnvironment.environment`, a copy built in the driver, for what is not an episode
(its `rows` and `stop`). What crosses: the row (pickled, once per episode), each `ModelTurn` and `Reply`, and the
`close()` reward. What does not: the environment's state after construction, which each episode's process has a
copy of (an episode's changes to it are its own).

A user's environment whose methods are coroutines is hosted too: a coroutine that calls something blocking without
awaiting would hold the driver's event loop, and every episode with it. The verifiers adapter alone runs in the
driver's event loop (tasks/environments/catalog.py): its episodes drive verifiers' own asyncio `Env.run`, and its
rows hold verifiers' objects; there cancellation ends a call that awaits.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from tasks.environments import frames
from tasks.environments.base import Environment, ModelTurn, Reply
from tasks.environments.config import EnvironmentConfig
from tasks.prompt import Prompt

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0
"""Most seconds the host may take to import and build the environment (the driver built it once already)."""
CONTROL_TIMEOUT_S = 30.0
"""Most seconds handing one episode to the host may block (it only forks)."""


class EnvironmentRaised(Exception):
    """An episode's call raised in its process; its repr is the original exception's."""

    def __init__(self, original: str):
        super().__init__(original)
        self.original = original

    def __repr__(self) -> str:
        return self.original


class EpisodeProcessLost(RuntimeError):
    """The episode's process ended without answering (it exited, crashed, or was killed)."""


class EnvironmentHost:
    """The host process of one environment: started on the first episode, closed at exit."""

    def __init__(self, cfg: EnvironmentConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.lock = threading.Lock()

    def ready(self) -> None:
        """Start the host unless it runs: imports and builds the environment, so it is not charged to a call's
        timeout (the first episode's opening would pay for it otherwise)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()

    def open(self, row: Prompt) -> socket.socket:
        """A new episode of `row` in a process of its own: the driver's end of its socket."""
        data = pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            driver_end, episode_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                socket.send_fds(self.control, [data], [episode_end.fileno()])
            except OSError as exc:
                driver_end.close()
                raise EpisodeProcessLost(f"the environment host did not take the episode ({exc!r})") from None
            finally:
                episode_end.close()
        return driver_end

    def _start(self) -> None:
        if self.proc is not None:
            log.warning("environment host exited (%s); starting another", self.proc.returncode)
            self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        path = os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)  # the user's modules, as imported here
        env = {**os.environ, "PYTHONPATH": path}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tasks.environments.host_process", str(theirs.fileno()),
             self.cfg.model_dump_json()],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)  # not in the terminal's group: a Ctrl-C is the driver's to handle
        theirs.close()
        self.control = ours
        ours.settimeout(START_TIMEOUT_S)
        try:
            message = ours.recv(1 << 16)
        except TimeoutError:
            self.close()
            raise RuntimeError(f"environment {self.cfg.name}: its host process did not build it within "
                               f"{START_TIMEOUT_S:g} s") from None
        status = pickle.loads(message) if message else ("failed", f"the host exited ({self.proc.wait()})")
        if status[0] != "ready":
            self.close()
            raise RuntimeError(f"environment {self.cfg.name}: its host process could not build it: {status[1]}")
        ours.settimeout(CONTROL_TIMEOUT_S)
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the host; it kills every episode's process before it exits."""
        proc, control, self.proc, self.control = self.proc, self.control, None, None
        if control is not None:
            control.close()
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class HostedEnvironment:
    """An Environment built from its config whose episodes run in processes of their own (module docstring)."""

    def __init__(self, cfg: EnvironmentConfig, environment: Environment):
        self.environment = environment
        self.host = EnvironmentHost(cfg)
        self.stop = list(getattr(environment, "stop", []))
        if hasattr(environment, "rows"):
            self.rows = environment.rows

    def episode(self, row: Prompt) -> HostedEpisode:
        self.host.ready()  # blocks once, on the first episode
        return HostedEpisode(self.host, row)

    def close(self) -> None:
        self.host.close()


class HostedEpisode:
    """An episode in its own process: each method a coroutine whose cancellation kills that process."""

    def __init__(self, host: EnvironmentHost, row: Prompt):
        self.host, self.row = host, row
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.pid: int | None = None
        self.lost: str | None = None

    async def opening(self) -> list[dict]:
        try:
            sock = self.host.open(self.row)
            self.reader, self.writer = await asyncio.open_unix_connection(sock=sock)
            _, self.pid = await self._receive()
        except BaseException:
            self.abandon("its process did not start")
            raise
        return await self._call("opening")

    async def step(self, turn: ModelTurn) -> Reply:
        return await self._call("step", turn)

    async def close(self) -> float | None:
        """The episode's close() in its process, then the process ends; nothing when it was killed already."""
        if self.writer is None or self.lost is not None:
            return None
        try:
            return await self._call("close")
        finally:
            if self.writer is not None:  # a close that failed was abandoned (killed) already
                self.writer.close()
                self.writer = None

    def abandon(self, why: str) -> None:
        """Kill the episode's process group now (a timeout, a cancelled step): the episode is over."""
        self.lost = self.lost or why
        if self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def _call(self, name: str, *args: Any) -> Any:
        if self.lost is not None or self.writer is None:
            raise EpisodeProcessLost(f"the episode's process is gone ({self.lost or 'not started'})")
        try:
            self.writer.write(frames.encode((name, args)))
            await self.writer.drain()
            tag, value = await self._receive()
        except BaseException as exc:  # a timeout's cancellation included: the call ends with its process
            self.abandon(f"its {name}() was cut off ({type(exc).__name__})")
            raise
        if tag == "error":
            raise EnvironmentRaised(value)
        return value

    async def _receive(self) -> tuple[str, Any]:
        try:
            header = await self.reader.readexactly(frames.HEADER.size)
            payload = await self.reader.readexactly(frames.length(header))
        except asyncio.IncompleteReadError:
            raise EpisodeProcessLost("the episode's process exited without answering (it crashed, exited or was "
                                     "killed)") from None
        return pickle.loads(payload)
