"""The environment host process: builds a run's environment once, then forks one process per episode.

`python -m tasks.environments.host_process CONTROL_FD CONFIG_JSON`, started by tasks/environments/host.py. The host
builds the environment from its config (tasks/environments/catalog.py `build_environment`), says "ready" on the
control socket, and then, for each episode, receives the row and one end of a fresh socket pair and forks. The
child makes the episode (`environment.episode(row)`) and answers the driver's calls on that socket (`opening`,
`step`, `close`: plain functions called, coroutines run on the child's own event loop), one at a time, until the
driver closes the socket. The driver kills a child whose call outlives `environment.step_timeout_s`, with its
process group: whatever the call does (sleeps, blocks on a lock, loops in C holding the GIL), it ends there.

Each child is a session leader (its process group is the driver's kill target) and dies with the host
(PR_SET_PDEATHSIG); the host kills every child when the driver closes the control socket, which the kernel also
does when the driver dies. The host runs no user code after the environment's constructor, so it stays
single-threaded and forking it is safe (a constructor that starts threads or opens connections shares them with
every episode's process: docs/environments.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import inspect
import json
import os
import pickle
import signal
import socket
import sys
from typing import Any

from tasks.environments import frames

PR_SET_PDEATHSIG = 1
MAX_CONTROL_BYTES = 1 << 20
"""Most bytes of one control message (a pickled row)."""


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    try:
        from tasks.environments.catalog import build_environment
        from tasks.environments.config import EnvironmentConfig

        environment = build_environment(EnvironmentConfig.model_validate(json.loads(sys.argv[2])))
    except Exception as exc:  # noqa: BLE001 - the driver raises it as one line
        control.send(pickle.dumps(("failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")))
        return
    children: set[int] = set()

    def reap(*_: object) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)

    signal.signal(signal.SIGCHLD, reap)
    gc.freeze()  # the children share the host's objects copy-on-write; a collection in them would touch them all
    control.send(pickle.dumps(("ready", os.getpid())))
    host = os.getpid()
    while True:
        data, fds, _, _ = socket.recv_fds(control, MAX_CONTROL_BYTES, 1)
        if not data:  # the driver closed the control socket, or died
            break
        row = pickle.loads(data)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the episode's own subprocesses are its own to wait for
            control.close()
            serve_episode(environment, row, socket.socket(fileno=fds[0]), host)  # never returns
        os.close(fds[0])
        children.add(pid)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for pid in list(children):
        for kill in (os.killpg, os.kill):  # its group; itself too, in case it has not made its group yet
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for pid in children:  # killed is not yet gone: the host exits once its episodes have
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped already
            pass


def serve_episode(environment: Any, row: Any, sock: socket.socket, host: int) -> None:
    """The child: make the episode, answer calls until the driver closes the socket, exit."""
    try:
        os.setsid()  # its own process group: the driver's kill takes what the episode started too
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != host:  # the host died before the line above
            os._exit(1)
        frames.send(sock, ("pid", os.getpid()))
        try:
            episode, failure = environment.episode(row), None
        except Exception as exc:  # noqa: BLE001 - reported as the first call's error
            episode, failure = None, f"environment.episode(row) raised {exc!r}"
        loop = None
        while (request := frames.receive(sock)) is not None:
            name, args = request
            if failure is not None:
                reply = ("error", failure)
            else:
                try:
                    fn = getattr(episode, name, None)
                    result = None if fn is None else fn(*args)  # a missing close() adds nothing
                    if inspect.isawaitable(result):
                        loop = loop or asyncio.new_event_loop()
                        result = loop.run_until_complete(result)
                    reply = ("ok", result)
                except BaseException as exc:  # noqa: BLE001 - SystemExit too: it ends the call, not the episode
                    reply = ("error", repr(exc))
            try:
                payload = frames.encode(reply)
            except frames.FrameError as exc:
                payload = frames.encode(("error", f"its {name}() result cannot go back to the driver: {exc}"))
            sock.sendall(payload)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # not the host's atexit handlers or buffers: they are the host's


if __name__ == "__main__":
    main()
