"""A reward worker's stderr (and stdout), read by the driver and logged line by line, at most so much per call.

A worker writing to the driver's own stderr could flood the run's log (a reward that prints per sample, or a
hostile one that writes gigabytes), and RLIMIT_FSIZE would apply to the driver's log file, failing a print once the
log passes it. So the worker writes into a pipe; one thread per worker logs each line (cut to MAX_LINE_CHARS) up
to MAX_BYTES_PER_CALL between two calls, drops the rest, and says how much it dropped. It keeps the last line,
for the error that says why a worker died.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("rewards.worker")

MAX_BYTES_PER_CALL = 64 << 10
MAX_LINE_CHARS = 1000
READ_BYTES = 1 << 16


class WorkerLog:
    """Drains `fd` (the worker's stderr) in a daemon thread until the worker and all it started close it."""

    def __init__(self, fd: int, pid: int):
        self.pid, self.last = pid, ""
        self._budget, self._dropped = MAX_BYTES_PER_CALL, 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(fd,), name=f"reward-worker-{pid}-log", daemon=True)
        self._thread.start()

    def new_call(self) -> None:
        """A call starts: report what was dropped since the last one, and give the worker a fresh budget."""
        with self._lock:
            dropped, self._dropped, self._budget = self._dropped, 0, MAX_BYTES_PER_CALL
        if dropped:
            log.warning("reward worker %d: %d bytes of its output dropped (over %d per call)", self.pid, dropped,
                        MAX_BYTES_PER_CALL)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _drain(self, fd: int) -> None:
        partial = b""
        with os.fdopen(fd, "rb", buffering=0) as stream:
            while chunk := stream.read(READ_BYTES):
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) > MAX_LINE_CHARS:  # no newline in sight: log what fits, drop the rest
                    lines.append(partial)
                    partial = b""
                for line in lines:
                    self._emit(line)
        if partial:
            self._emit(partial)
        self.new_call()  # report a last drop

    def _emit(self, line: bytes) -> None:
        with self._lock:
            if self._budget <= 0:
                self._dropped += len(line) + 1
                return
            self._budget -= len(line) + 1
        text = line[:MAX_LINE_CHARS].decode(errors="replace").rstrip()
        if text:
            self.last = text[:200]
            log.info("reward worker %d: %s", self.pid, text)
