"""The wire between the driver and an episode's process (tasks/environments/host.py): pickled frames on a socket.

A frame is a 4-byte length and a pickle. Both ends are this run's own code and the user's environment (trusted as
it is in the driver: it is the user's program, not the model's text); the cap only stops a runaway reply from
filling the driver's memory.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 64 << 20


class FrameError(RuntimeError):
    """A frame that cannot be sent or read (too large, or not picklable)."""


def encode(obj: Any) -> bytes:
    """`obj` as one frame."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - pickle raises PicklingError, TypeError or AttributeError
        raise FrameError(f"it cannot be pickled ({exc!r})"[:300]) from None
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"it is {len(data)} bytes pickled, over the {MAX_FRAME_BYTES}-byte cap")
    return HEADER.pack(len(data)) + data


def length(header: bytes) -> int:
    """The payload length a frame header announces (refused over the cap)."""
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {size} bytes is over the {MAX_FRAME_BYTES}-byte cap")
    return size


def send(sock: socket.socket, obj: Any) -> None:
    sock.sendall(encode(obj))


def receive(sock: socket.socket) -> Any:
    """The next frame's object from a blocking socket; None when the other end has closed it."""
    header = _exactly(sock, HEADER.size)
    if header is None:
        return None
    payload = _exactly(sock, length(header))
    if payload is None:
        return None
    return pickle.loads(payload)


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
