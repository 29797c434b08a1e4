"""`RolloutServer`: the Ray actor that owns one engine server process (the control plane).

It runs on the node where the engine runs, so serving an adapter needs no shared filesystem: a `LoraAdapter`'s
tensors arrive through the Ray object store, are written here as a PEFT folder, and hot-loaded under the adapter's
name. It keeps one map of the adapters it serves, by name; a restarted engine loads every one again. An adapter is
unloaded first and its folder deleted only then (vLLM re-reads a registered adapter's folder after cache eviction;
deleting it early kills the server).

Its resources (CPUs, GPUs, the `TPU` resource) are the driver's Ray options for it (the run config's
`rollout.resources`), so on a TPU VM it takes its own chips. On another node than the driver's, the server binds
that node's address and the URL it returns is `http://<node address>:<port>` (`engine_address`), which is also what
its health checks dial. The class is plain Python (testable without Ray); `setup_rollout_server` wraps it as an actor.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from common.lora_adapter import LoraAdapter
from rollout.backend import setup_backend
from rollout.config import BackendConfig, RolloutConfig
from rollout.server_process import engine_address

log = logging.getLogger(__name__)


class RolloutServer:
    """One engine server process, its adapters and restarts."""

    def __init__(self, cfg: BackendConfig, model_path: Path, workdir: Path | None = None,
                 driver_ip: str | None = None):
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="aha-rollout-"))
        self.backend = setup_backend(cfg, Path(model_path), self.workdir)
        self.driver_ip = driver_ip
        """Ray node address of the driver that dials this server (None: not under Ray, the same host)."""
        self.max_rank = getattr(cfg, "max_lora_rank", None)
        self.served: dict[str, Path] = {}  # every adapter the engine serves: its name -> its PEFT folder
        self._serves = 0  # serves so far: each one's folder is new (see serve)
        atexit.register(self.backend.stop)  # a clean actor exit never leaves the engine running

    def start(self) -> str:
        """Launch the server (no-op if running) on an address the driver can reach; return its base_url."""
        bind, dial = engine_address(self.backend.cfg.host, node_ip(), self.driver_ip)
        self.backend.cfg = self.backend.cfg.model_copy(update={"host": bind})
        self.backend.dial_host = dial
        return self.backend.start()

    def base_url(self) -> str | None:
        """base_url of the running server."""
        return self.backend.base_url

    def pid(self) -> int | None:
        """The server's process (group) id."""
        return self.backend.pid()

    def is_alive(self) -> bool:
        """Process alive and healthy."""
        return self.backend.is_alive()

    def log_tail(self, n: int = 50) -> str:
        """Last n lines of the current server log."""
        return self.backend.log_tail(n)

    def stop(self) -> None:
        """Stop the server; idempotent. Adapter folders stay until the actor's workdir is removed."""
        self.backend.stop()

    def restart(self) -> str:
        """Stop, start, and load every served adapter again; return the (possibly new) base_url."""
        self.backend.stop()
        url = self.backend.start()
        for name, folder in self.served.items():
            self.backend.load_lora(name, folder)
        return url

    def ensure_alive(self) -> str | None:
        """None if the server is healthy; else restart it and return what happened, with the dead server's log."""
        if self.backend.is_alive():
            return None
        why = self.backend.log_excerpt()
        self.restart()
        return f"rollout server died and was restarted (adapters {sorted(self.served)} re-loaded); its log:\n{why}"

    def serve(self, adapter: LoraAdapter) -> dict:
        """Write `adapter` as a PEFT folder and load it under its name (one served under that name already is
        replaced); timings in s. Later requests naming it use these weights."""
        if self.max_rank is not None and adapter.rank is not None and adapter.rank > self.max_rank:
            raise ValueError(f"LoRA rank {adapter.rank} of adapter {adapter.name!r} exceeds "
                             f"rollout.backend.max_lora_rank ({self.max_rank}); raise it")
        t0 = time.perf_counter()
        self.unserve(adapter.name)
        # A folder of its own for every serve: vLLM keys its prefix cache by adapter name *and path*, so weights
        # served again under a name must not come from the same path (they would reuse KV of the old ones).
        self._serves += 1
        folder = adapter.write(self.workdir / "adapters" / f"{adapter.name}.{self._serves}")
        t1 = time.perf_counter()
        self.backend.load_lora(adapter.name, folder)
        self.served[adapter.name] = folder
        t2 = time.perf_counter()
        log.info("adapter %s loaded (write %.3f s, load %.3f s)", adapter.name, t1 - t0, t2 - t1)
        return {"write_s": t1 - t0, "load_s": t2 - t1}

    def unserve(self, name: str) -> None:
        """Stop serving `name` and delete its folder (only after the engine has forgotten it: see above); a name
        not served is a no-op."""
        folder = self.served.pop(name, None)
        if folder is not None:
            self.backend.unload_lora(name)
            shutil.rmtree(folder, ignore_errors=True)

    def node(self) -> str | None:
        """This actor's Ray node address (None outside Ray)."""
        return node_ip()

    def kill_node(self) -> None:
        """Test fault (`kill_node`): SIGKILL this engine's Ray node at once, as a host lost: the server's process
        group, the raylet that started this worker (the node's other Ray processes exit with it), and this actor."""
        raylet = os.getppid()
        if Path(f"/proc/{raylet}/comm").read_text().strip() != "raylet":
            raise RuntimeError(f"kill_node: this actor's parent {raylet} is not a raylet; not killing it")
        if (pgid := self.backend.pid()) is not None:
            os.killpg(pgid, signal.SIGKILL)
        os.kill(raylet, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def shutdown(self) -> None:
        """Stop the server and delete the workdir (adapters, logs)."""
        self.backend.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def node_ip() -> str | None:
    """This process's Ray node address; None outside Ray."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else None


def setup_rollout_server(cfg: RolloutConfig, model_path: Path, actor_options: dict[str, Any] | None = None):
    """Start a `RolloutServer` Ray actor (server not started yet). `actor_options` are the driver's Ray options for
    it: its resources (`num_cpus`, `num_gpus`, `resources={"TPU": chips}`, custom node resources) and placement
    (`scheduling_strategy`, e.g. one bundle of a fleet's placement group). Where an engine runs is the driver's call,
    not the rollout part's; the caller's node address goes with it, so the server binds one the caller can reach."""
    import ray

    options = {"num_cpus": 1, **(actor_options or {}), "max_restarts": 0}
    return ray.remote(RolloutServer).options(**options).remote(cfg.backend, Path(model_path), driver_ip=node_ip())
