"""The engine's start-up timeout: a default per engine and platform, the TPU configs' allowance, and a message that
names the key to raise. Fails on main at 85b20f9: there every vLLM engine waited 600 s whatever its platform (vllm-tpu
compiles its LoRA kernels before /health answers), no TPU config raised it, and `start_timeout_s` did not exist."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from orchestration.config.files import load_config
from rollout.config import VllmConfig
from rollout.server_process import ServerProcess
from rollout.sglang_jax_config import SglangJaxConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("config,platform,seconds", [(VllmConfig, "cpu", 600), (VllmConfig, "gpu", 900),
                                                     (VllmConfig, "tpu", 1800), (SglangJaxConfig, "cpu", 900),
                                                     (SglangJaxConfig, "tpu", 1800)])
def test_the_default_is_per_engine_and_platform(config, platform, seconds):
    assert config(platform=platform).start_timeout_s == seconds
    assert config(platform=platform, startup_timeout_s=42).start_timeout_s == 42  # a set value wins


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*tpu*.yaml")), ids=lambda p: p.stem)
def test_tpu_configs_allow_their_engine_1800_s(path):
    backend = load_config(path).rollout.backend
    assert backend.startup_timeout_s is not None and backend.start_timeout_s >= 1800, path.name


class Mute(ServerProcess):
    """A stand-in engine: a real process that never answers /health."""

    engine_name = "mute-server"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]

    def environment(self) -> dict[str, str]:
        return {}


def test_a_start_that_times_out_names_the_key_to_raise(tmp_path):
    server = Mute(VllmConfig(python=sys.executable, startup_timeout_s=1), tmp_path, tmp_path)
    with pytest.raises(RuntimeError, match=r"not healthy after 1 s \(set\); raise rollout.backend.startup_timeout_s"):
        server.start()
    assert not server.is_alive()


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
