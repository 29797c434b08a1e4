"""Whether the server that answers on a port is the one we started: a process of its process group holds the socket
listening there.

An engine binds its port seconds after it starts (after its imports); a port picked free can be taken meanwhile by
another process, and if that one answers `GET /health` 200 (any HTTP server does) a start that only polled /health
would take it for the engine and send it every request, the API key included. The kernel says who listens:
/proc/net/tcp{,6} gives the listening socket's inode, /proc/PID/fd of the group's processes the sockets they hold.
Linux only, as the engines are; the server runs on this host (the actor started it) and in its network namespace.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listening_inodes(port: int) -> set[str]:
    """Inodes of the sockets listening on TCP `port` (any address, IPv4 or IPv6) in this network namespace."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes


def group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            # Fields after the command's closing parenthesis (the command may hold spaces): state, ppid, pgrp, ...
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                members.append(int(entry))
    return members


def group_listens_on(pgid: int, port: int) -> bool:
    """Whether a process of group `pgid` holds a socket listening on TCP `port` of this host."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    if not wanted:
        return False
    for pid in group_members(pgid):
        with contextlib.suppress(OSError):  # a process that exited meanwhile
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                        return True
    return False
