"""An engine's port, picked free, taken by another process before the engine binds it (the engine binds only after
its imports, seconds later): the start tries again on another port; a configured port that is taken is an error that
says so. Real processes hold the ports; the server is a stand-in that binds late, as an engine does (that a real vLLM
server exits on such a port with "[Errno 98] Address already in use" in its log, which the retry matches, was
checked by hand on 2026-11-28, not in the suite: it would cost an engine start)."""

from __future__ import annotations

import http.server
import socket
import sys
import threading

import pytest

from rollout.config import VllmConfig
from rollout.server_process import ServerProcess


class Late(ServerProcess):
    """A stand-in engine that binds its port after a pause, as an engine binds after its imports, then answers
    /health. Its first start finds the port taken by another process (this test's), as a port picked free can be
    taken by anything in those seconds."""

    engine_name = "late-server"
    SERVE = ("import http.server, sys, time\n"
             "class H(http.server.BaseHTTPRequestHandler):\n"
             "    def do_GET(self):\n"
             "        self.send_response(200); self.end_headers()\n"
             "time.sleep(0.3)\n"
             "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")

    def __init__(self, *args):
        super().__init__(*args)
        self.taken: list[socket.socket] = []

    def command(self, port: int) -> list[str]:
        if not self.taken:  # another process takes the port between its pick and the server's bind
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            self.taken.append(sock)
        return [sys.executable, "-c", self.SERVE, str(port)]

    def environment(self) -> dict[str, str]:
        return {}


def test_a_port_taken_before_the_server_binds_it_is_replaced(tmp_path, caplog):
    """The server exits on "Address already in use"; the start picks another port and the server is healthy there.
    Fails on main at 9e6dceb (the start failed with the server's traceback; engines had no second try)."""
    server = Late(VllmConfig(python=sys.executable, startup_timeout_s=30), tmp_path, tmp_path)
    try:
        url = server.start()
        taken = server.taken[0].getsockname()[1]
        assert not url.endswith(f":{taken}") and server.is_alive(), url
        assert any("a port it binds was taken" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        server.stop()
        server.taken[0].close()


def test_a_configured_port_that_is_taken_is_an_error_that_says_so(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = Late(VllmConfig(python=sys.executable, startup_timeout_s=30, port=port), tmp_path, tmp_path)
        server.taken.append(holder)  # already taken: the stand-in takes nothing more
        taken = r"(?s)a port it binds was taken: .* or one of its own\); last lines of .*Address already in use"
        with pytest.raises(RuntimeError, match=taken):
            server.start()


class Answers200(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


class Thief(Late):
    """The same stand-in, whose port is taken first by an HTTP server that answers every GET 200 (/health too):
    a real listener in this test's process, not the server started."""

    def __init__(self, *args):
        super().__init__(*args)
        self.thieves: list[http.server.HTTPServer] = []

    def command(self, port: int) -> list[str]:
        if not self.thieves:
            thief = http.server.HTTPServer(("127.0.0.1", port), Answers200)
            threading.Thread(target=thief.serve_forever, daemon=True).start()
            self.thieves.append(thief)
        return [sys.executable, "-c", self.SERVE, str(port)]


def test_a_port_thief_that_answers_health_is_not_taken_for_the_engine(tmp_path, caplog):
    """Another process takes the engine's port first and answers /health 200: the start does not take it for the
    engine (no process of the engine's group listens there), waits for its own server, which exits on the taken
    port, and starts it again on another port. Fails on main at 50ebc49: the start returned the thief's address at
    its first /health answer, and every request would have gone to the thief."""
    server = Thief(VllmConfig(python=sys.executable, startup_timeout_s=30), tmp_path, tmp_path)
    try:
        url = server.start()
        stolen = server.thieves[0].server_address[1]
        assert not url.endswith(f":{stolen}"), f"the thief on port {stolen} was taken for the engine: {url}"
        assert server.is_alive(), url
        assert any("another process holds it" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        server.stop()
        for thief in server.thieves:
            thief.shutdown()
            thief.server_close()
