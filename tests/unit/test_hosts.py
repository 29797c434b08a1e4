"""What changes when a part lands on another host: the address an engine binds and the one the driver dials, the
per-run API key, custom Ray resources per part, and the refusal of a local run dir on several nodes.

The multi-node runs themselves are in tests/integration/test_multinode.py.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rollout.handle import with_run_key
from orchestration.config.schema import ActorResources, RunConfig
from orchestration.config.files import load_config
from orchestration.cluster.resources import demands, shortfall
from orchestration.run_dir import RunDir, RunDirError, check_shared
from rollout.config import RolloutConfig, VllmConfig
from rollout.server_process import ServerProcess, engine_address

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "countdown_smollm2_cpu.yaml"


def test_engine_on_another_node_binds_and_is_dialled_at_its_node_address():
    assert engine_address(None, "10.0.0.3", "10.0.0.3") == ("127.0.0.1", "127.0.0.1")
    assert engine_address(None, "10.0.0.3", "10.0.0.2") == ("10.0.0.3", "10.0.0.3")
    assert engine_address(None, None, None) == ("127.0.0.1", "127.0.0.1")  # not under Ray
    assert engine_address("10.9.9.9", "10.0.0.3", "10.0.0.2") == ("10.9.9.9", "10.9.9.9")


def test_wildcard_bind_never_becomes_the_url():
    assert engine_address("0.0.0.0", "10.0.0.3", "10.0.0.2") == ("0.0.0.0", "10.0.0.3")
    assert engine_address("0.0.0.0", "10.0.0.3", "10.0.0.3") == ("0.0.0.0", "127.0.0.1")


def test_loopback_engine_on_another_node_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="host 127.0.0.1 is loopback.*leave rollout.backend.host unset"):
        engine_address("127.0.0.1", "10.0.0.3", "10.0.0.2")


class HealthServer(ServerProcess):
    """A stand-in engine: a 10-line HTTP server (a real process) that answers /health, for the URL logic only."""

    engine_name = "health-server"

    def command(self, port: int) -> list[str]:
        code = textwrap.dedent(f"""
            import http.server
            class H(http.server.BaseHTTPRequestHandler):
                def do_GET(self):
                    self.send_response(200 if self.path == "/health" else 404); self.end_headers()
                def log_message(self, *a): pass
            http.server.ThreadingHTTPServer(({self.bind_host!r}, {port}), H).serve_forever()
        """)
        return [sys.executable, "-c", code]

    def environment(self) -> dict[str, str]:
        return {}


def test_server_bound_to_every_interface_reports_a_url_it_can_be_reached_at(tmp_path):
    """Fails on main: there `host: 0.0.0.0` became `http://0.0.0.0:PORT`, an address no client should dial."""
    server = HealthServer(VllmConfig(host="0.0.0.0", python=sys.executable, startup_timeout_s=30), tmp_path, tmp_path)
    try:
        url = server.start()
        assert url.startswith("http://127.0.0.1:"), url
        assert server.is_alive()
    finally:
        server.stop()


def test_a_run_key_is_made_for_every_engine_on_loopback_too():
    """Fails on main at 98997ee: an engine bound to loopback (the driver's own host) got no key, so any local process
    (another user, a reward function) could sample from the policy or unload its adapter."""
    rollout = RolloutConfig(backend=VllmConfig())
    keyed = with_run_key(rollout)
    assert keyed.backend.api_key and len(keyed.backend.api_key) >= 24
    assert with_run_key(rollout).backend.api_key != keyed.backend.api_key, "one key per run, not a constant"
    assert with_run_key(RolloutConfig(backend=VllmConfig(host="127.0.0.1"))).backend.api_key
    assert with_run_key(RolloutConfig(backend=VllmConfig(api_key="mine"))).backend.api_key == "mine"


def test_custom_resources_pin_a_part_and_a_missing_one_is_named():
    r = ActorResources(custom={"engine_host": 1})
    assert r.ray_options() == {"num_cpus": 1.0, "num_gpus": 0.0, "resources": {"engine_host": 1}}
    cfg = load_config(CONFIG, ["rollout.resources.custom={engine_host: 1}", "rollout.replicas=2"])
    nodes = [{"CPU": 4.0, "engine_host": 1.0}, {"CPU": 4.0}]
    why = shortfall(demands(cfg), nodes, {"learner": 1, "engine": 2})
    assert why is not None and "rollout.resources.custom.engine_host" in why and "engine_host: 1" in why, why
    assert shortfall(demands(cfg), [*nodes, {"CPU": 1.0, "engine_host": 1.0}], {"learner": 1, "engine": 2}) is None
    with pytest.raises(ValueError, match="custom resources need a name of your own"):
        ActorResources(custom={"CPU": 1})


def test_local_run_dir_on_several_nodes_is_refused_in_one_line(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    check_shared(run_dir, shared=False, nodes=1)
    check_shared(run_dir, shared=True, nodes=3)
    with pytest.raises(RunDirError) as err:
        check_shared(run_dir, shared=False, nodes=3)
    assert "\n" not in str(err.value) and "gs://" in str(err.value) and "train.run_dir_shared" in str(err.value)


def test_run_dir_shared_key_is_part_of_the_config():
    assert RunConfig.model_fields["train"].annotation.model_fields["run_dir_shared"].default is False
