"""A TCP relay that counts the bytes clients send through it: put it between a storage client and the GCS emulator
to measure what an upload path really puts on the wire (request lines, headers and bodies), without touching the
client. Used by tests/integration/test_run_storage.py and bench/bench_run_storage.py.

    with CountingProxy("127.0.0.1", emulator_port) as proxy:
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
        ...                                      # every request of the storage client goes through it
        proxy.sent                               # bytes sent to the emulator so far
"""

from __future__ import annotations

import socket
import threading


class CountingProxy:
    """Relays every connection to (host, port) and counts the client-to-server bytes."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.sent = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.close()
        for s in list(self._open):
            with _quiet():
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        with _quiet():
            while data := src.recv(65536):
                if count:
                    with self._lock:
                        self.sent += len(data)
                dst.sendall(data)
        with _quiet():
            dst.shutdown(socket.SHUT_WR)


class _quiet:
    """Ignore the OSError of a connection the other side closed."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, OSError)
