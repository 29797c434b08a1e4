"""`SglangJaxBackend`: the SGLang-JAX engine behind the same contract as `VllmBackend` (`kind: sglang_jax`).

The server is `rollout/sglang_jax_entry.py` run by the SGLang-JAX env's interpreter (Python 3.12, sglang-jax 0.0.2,
jax 0.8): the engine in-process, wrapped in the `/health`, `/v1/completions`, `/v1/load_lora_adapter` subset of
vLLM's API that `rollout.client` speaks. Differences from vLLM that callers can see:

- a LoRA push merges the adapter into the base weights of the running engine (W0 + alpha/r * B @ A, always from
  W0), so exactly one adapter (or the base model) is live; requests for any other name are refused (404);
- `repetition_penalty` is not applied by the engine, and `seed` only with `deterministic_sampling: true`: requests
  asking for them are rejected here, before anything is sent, with a one-line error;
- logprobs are those of the tempered distribution (after penalties and temperature, before top-k/top-p/min-p);
  with top_k = -1, top_p = 1, min_p = 0 that is vLLM's processed_logprobs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from rollout.sglang_jax_config import SglangJaxConfig
from rollout.types import SamplingParams
from rollout.vllm_server import free_port

log = logging.getLogger(__name__)

ENTRY = Path(__file__).with_name("sglang_jax_entry.py")
ENGINE = "sglang_jax"
# The driver's Python settings (3.12 learner env, fake-device XLA flags) must not leak into the engine env.
_DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS")


# `sampling.extra` keys the wrapper maps onto the engine (include_stop_str_in_output -> SGLang's no_stop_trim).
SUPPORTED_EXTRA = frozenset({"include_stop_str_in_output"})


def check_sampling(params: SamplingParams, deterministic: bool) -> None:
    """Raise a one-line ValueError for a sampling field SGLang-JAX would not honour."""
    if unknown := sorted(set(params.extra) - SUPPORTED_EXTRA):
        raise ValueError(f"rollout.backend.kind {ENGINE} does not support sampling.extra {unknown}; "
                         f"remove them (supported: {sorted(SUPPORTED_EXTRA)})")
    if params.repetition_penalty != 1.0:
        raise ValueError(f"rollout.backend.kind {ENGINE} does not apply sampling.repetition_penalty "
                         f"({params.repetition_penalty}); set it to 1.0 or use presence/frequency_penalty")
    if params.seed is not None and not deterministic:
        raise ValueError(f"rollout.backend.kind {ENGINE} ignores sampling.seed ({params.seed}) without "
                         "deterministic sampling; set rollout.backend.deterministic_sampling: true or seed: null")


class SglangJaxBackend:
    """Launch, watch and stop one wrapped SGLang-JAX server; speak its completions dialect."""

    def __init__(self, cfg: SglangJaxConfig, model_path: Path, workdir: Path | None = None):
        self.cfg = cfg
        self.model_path = Path(model_path)
        self.workdir = Path(workdir) if workdir else None
        self.base_url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log_path: Path | None = None

    # ---- control plane -------------------------------------------------------------------------------------

    def command(self, port: int) -> list[str]:
        """The server's command line."""
        import json

        c = self.cfg
        cmd = [
            # -P: do not put rollout/ on sys.path, where our types.py would shadow the standard library's.
            str(c.interpreter), "-P", str(ENTRY), "--model", str(self.model_path), "--workdir", str(self.workdir),
            "--host", c.host, "--port", str(port), "--served-model-name", c.served_model_name,
            "--device", c.device, "--dtype", c.dtype, "--max-model-len", str(c.max_model_len),
            "--max-total-tokens", str(c.max_total_tokens), "--max-running-requests", str(c.max_running_requests),
            "--page-size", str(c.page_size), "--max-logprobs", str(c.max_logprobs),
            "--tp-size", str(c.tensor_parallel_size), "--random-seed", str(c.random_seed),
            "--server-args-json", json.dumps(c.extra_args),
        ]
        if c.kv_cache_space_gb is not None:
            cmd += ["--kv-cache-gb", str(c.kv_cache_space_gb)]
        if c.deterministic_sampling:
            cmd.append("--deterministic-sampling")
        if c.precompile:
            cmd.append("--precompile")
        return cmd

    def environment(self) -> dict[str, str]:
        """The server's environment: ours minus the driver's Python settings, plus the engine's."""
        env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
        threads = str(self.cfg.cpu_threads or os.cpu_count() or 1)
        env.update({
            "HF_HUB_OFFLINE": "1",
            # Ray sets OMP_NUM_THREADS=1 in its workers, which would make the CPU engine single-threaded.
            "OMP_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
        })
        if self.cfg.device == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
        env.update(self.cfg.env)
        return env

    def start(self) -> str:
        """Launch the server and block until /health answers; return base_url. Raises with the log tail."""
        if self._proc is not None and self._proc.poll() is None:
            return self.base_url
        if not self.cfg.interpreter.exists():
            raise FileNotFoundError(f"SGLang-JAX interpreter {self.cfg.interpreter} not found; run "
                                    "`bash scripts/setup_sglang_env.sh` or set rollout.backend.python")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="aha-sglang-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = self.cfg.port or free_port(self.cfg.host)
        self._log_path = self.workdir / f"server-{port}-{int(time.time())}.log"
        log.info("starting SGLang-JAX on %s:%d (log %s)", self.cfg.host, port, self._log_path)
        with open(self._log_path, "ab") as out:
            self._proc = subprocess.Popen(self.command(port), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.environment(), cwd=self.workdir,
                                          start_new_session=True)
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
                raise RuntimeError(f"SGLang-JAX server exited with code {self._proc.returncode} during start-up; "
                                   f"last lines of {self._log_path}:\n{self.log_tail()}")
            if self._healthy(timeout_s=2.0):
                return
            time.sleep(0.5)
        raise RuntimeError(f"SGLang-JAX server not healthy after {self.cfg.startup_timeout_s:.0f} s; raise "
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
        """Process id of the server (also its process group id)."""
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
        log.info("SGLang-JAX server %d stopped", proc.pid)

    def log_tail(self, n: int = 50) -> str:
        """The last n lines of the server log ('' before start)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        with open(self._log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))

    def load_lora(self, name: str, path: Path) -> None:
        """Merge the PEFT adapter in `path` into the live weights; later requests name it `name`."""
        self._control("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_lora(self, name: str) -> None:
        """Back to the base weights if `name` is live; a no-op for a name a newer version already replaced."""
        self._control("/v1/unload_lora_adapter", {"lora_name": name})

    def _control(self, route: str, body: dict[str, Any]) -> None:
        if self.base_url is None:
            raise RuntimeError(f"{route}: the SGLang-JAX server is not started; call start() first")
        try:
            resp = httpx.post(f"{self.base_url}{route}", json=body, timeout=300.0)
        except httpx.HTTPError as e:
            raise RuntimeError(f"{route} failed ({e!r}); server log:\n{self.log_tail()}") from e
        if resp.status_code != 200:
            raise RuntimeError(f"{route} {body} -> {resp.status_code}: {resp.text.strip()[:500]}")

    # ---- wire format ---------------------------------------------------------------------------------------

    def build_payload(self, prompt: list[int], params: SamplingParams, lora_name: str | None) -> dict[str, Any]:
        """/v1/completions body of the wrapper; raises for sampling fields the engine would not honour."""
        check_sampling(params, self.cfg.deterministic_sampling)
        payload = params.to_payload()
        payload.update(model=lora_name or self.cfg.served_model_name, prompt=list(prompt), stream=False)
        return payload

    def parse_choice(self, choice: dict[str, Any]) -> tuple[list[int], list[float], dict[str, Any]]:
        """Token ids from `token_ids`, logprobs from `logprobs.token_logprobs`; top logprobs, stop_reason as extra."""
        token_ids = choice.get("token_ids")
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs")
        if token_ids is None or logprobs is None or len(token_ids) != len(logprobs):
            raise RuntimeError(f"SGLang-JAX response lacks matching token_ids/logprobs: {str(choice)[:300]}")
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
