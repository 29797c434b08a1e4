"""Pinning a whole process to its cores, every thread of it, and reading where each thread may run.

Linux CPU affinity belongs to a thread: `os.sched_setaffinity(0, cores)` moves only the calling thread, and a thread
inherits its creator's mask when it starts. A process that pins itself after other threads exist (a Ray worker's
own threads, a library that starts a pool at import) leaves those on every core, and whatever they start later too:
in a pinned learner actor 23 of 32 threads were still allowed on the engine's core (issue 37). `pin_process` moves
every thread there is, so every thread started later, by any of them, inherits the mask. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def thread_ids(pid: int | str = "self") -> list[int]:
    """The ids of the threads of process `pid` (this one by default); [] when it is gone."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


def pin_process(cores: Iterable[int]) -> None:
    """Allow every thread of this process on `cores` only (and so each thread they start later).

    Repeats until a pass finds no thread it has not pinned: a thread started during a pass by a thread not yet
    pinned would otherwise keep the old mask."""
    cores = set(cores)
    pinned: set[int] = set()
    while todo := set(thread_ids()) - pinned:
        for tid in todo:
            try:
                os.sched_setaffinity(tid, cores)
            except ProcessLookupError:  # it ended between the listing and now
                pass
        pinned |= todo


def allowed_cores(pid: int) -> dict[int, set[int]]:
    """Each live thread of process `pid` and the cores it may run on (its Cpus_allowed_list)."""
    out = {}
    for tid in thread_ids(pid):
        try:
            out[tid] = os.sched_getaffinity(tid)
        except ProcessLookupError:
            pass
    return out
