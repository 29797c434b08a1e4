"""Interrupts that are honoured however the process was started.

A process started as a background job of a non-interactive shell (`cmd &` in a script, nohup) inherits SIGINT as
*ignored*, and Python then installs no KeyboardInterrupt handler: Ctrl-C or `kill -INT` did nothing and a training
run went on to its last step and exited 0. Ray's `ray.init` replaces the SIGTERM handler with `sys.exit(15)`.
So every entry point calls `install()` at start (and again after joining Ray): SIGINT and SIGTERM both raise
`Interrupted`, a KeyboardInterrupt, in the main thread, wherever it is blocked; the caller checkpoints and exits
with `exit_code()` (128 + the signal number, as a shell reports a process killed by it).

One more trap: a signal that lands while the main thread waits in a Ray call (`ray.get` of a push, an update, a
save) runs our handler inside Ray's own signal check, and Ray turns the `Interrupted` it raised into a plain
`KeyboardInterrupt`, losing which signal it was. Callers pass any KeyboardInterrupt through `interrupted()`, which
gives it back its signal (the handler records each one it takes).
"""

from __future__ import annotations

import signal
import threading


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `signum` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def exit_code(self) -> int:
        return 128 + self.signum


_received: list[int] = []
"""Signals the handler took, oldest first (what a plain KeyboardInterrupt from Ray was)."""


def _raise(signum: int, frame: object) -> None:
    _received.append(signum)
    raise Interrupted(signum)


def taken() -> int:
    """How many signals the handler has taken so far (a test's hold waits for the next one)."""
    return len(_received)


def interrupted(exc: KeyboardInterrupt) -> Interrupted:
    """`exc` as an `Interrupted` naming its signal, also when Ray re-raised it as a plain KeyboardInterrupt."""
    if isinstance(exc, Interrupted):
        return exc
    return Interrupted(_received[-1] if _received else signal.SIGINT)


def install() -> None:
    """Make SIGINT and SIGTERM raise `Interrupted` in the main thread, whatever dispositions were inherited."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("orchestration.signals.install() must run in the main thread (Python delivers "
                           "signals only there); call it from the entry point's main()")
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise)
