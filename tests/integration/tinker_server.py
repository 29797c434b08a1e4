"""Start and stop a real `aha tinker` for the tests (its own process group: Ray, the learner, the engines), and the
official SDK's clients pointed at it. Nothing is faked: the server is the CLI a user runs, the client the SDK."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "tinker_smollm2_cpu.yaml"
START_S = 600
PROBE = Path(__file__).with_name("tokenizer_probe.py")


@dataclass
class Server:
    proc: subprocess.Popen
    run_dir: Path
    base_url: str
    api_key: str
    log: Path
    clients: list = field(default_factory=list)

    def client(self, **kwargs):
        """An SDK ServiceClient, closed (its session finished) when the server is stopped: a session left open
        keeps its heartbeat thread in the test process, which logged "Tinker is down" for the rest of the lane."""
        import tinker

        self.clients.append(tinker.ServiceClient(base_url=self.base_url, api_key=self.api_key, **kwargs))
        return self.clients[-1]

    def rest(self):
        import tinker

        return tinker.RestClient(base_url=self.base_url, api_key=self.api_key)


def start(run_dir: Path, *overrides: str, api_key: str | None = None, env: dict[str, str] | None = None) -> Server:
    """`aha tinker` on CONFIG with `overrides`, writing under `run_dir` (`env`: added to its environment); returns
    once it serves."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"server-{time.time_ns()}.log"
    info = run_dir / "tinker.json"
    info.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS")} | {"PYTHONUNBUFFERED": "1",
                                                                                              **(env or {})}
    cmd = [sys.executable, "-m", "orchestration.cli", "tinker", "--config", str(CONFIG), "--run-dir", str(run_dir),
           "--port", "0", *(["--api-key", api_key] if api_key else []), *overrides]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_S
    while not info.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(Server(proc, run_dir, "", "", log))
            raise AssertionError(f"aha tinker did not come up (exit {proc.returncode}):\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    found = json.loads(info.read_text())
    return Server(proc, run_dir, found["base_url"], found["api_key"], log)


def stop(server: Server, sig: int = signal.SIGTERM, timeout_s: float = 120) -> None:
    """Close its clients, then end the server with `sig`; its whole process group goes with it (SIGKILL after
    `timeout_s`)."""
    for client in server.clients:
        with contextlib.suppress(Exception):  # a server already stopped by the test: the session ends with it
            client.close("success").result(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, sig)
    try:
        server.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)


def client_env(hf_home: Path) -> dict[str, str]:
    """What a client on another machine that ran setup sets to load a served model's tokenizer (docs/tinker.md):
    the Hub cache setup laid out, the Hub offline; HF_HOME a scratch folder, so nothing else of this machine's is
    read."""
    from common.hf_cache import hub_dir

    return {"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hub_dir()), "HF_HUB_OFFLINE": "1"}


def probe_argv(url: str, api_key: str, base_model: str, text: str) -> list[str]:
    """tokenizer_probe.py's command, the script as source (another node's mounts may differ)."""
    return [sys.executable, "-c", PROBE.read_text(), url, api_key, base_model, text]


def probe_tokenizers(server: Server, base_model: str, text: str, cwd: Path) -> dict:
    """tokenizer_probe.py's answer from a process in `cwd` with only client_env's Hugging Face settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE", "TRANSFORMERS"))}
    cwd.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(probe_argv(server.base_url, server.api_key, base_model, text), cwd=cwd, capture_output=True,
                         text=True, timeout=300, env=env | client_env(cwd / "hf-home"))
    assert out.returncode == 0, f"the SDK client failed (exit {out.returncode}):\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])
