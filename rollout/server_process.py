"""`ServerProcess`: what every engine backend does with its server process, written once.

An engine server runs from its own env as a subprocess in its own session (so stop() can take the API server and
its engine children down as one process group), logs to a file whose tail goes into every error, and is healthy
when `GET /health` answers 200. The completions dialect both engines speak (our HTTP contract: token ids in,
token ids and sampled-token logprobs out) is written here too. Subclasses give the command line, their engine's
environment variables, and where their dialect differs.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from rollout.capabilities import check_sampling
from rollout.port_owner import group_listens_on
from common.sampling import SamplingParams

log = logging.getLogger(__name__)

# A line that starts an error report in an engine log: a Python traceback, or a log record at level ERROR
# (vLLM: "(EngineCore_DP0 pid=7) ERROR 11-25 13:24:21 [core.py:...]"). Words like "error" in WARNING lines do not count.
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\bERROR\b")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")
# Variables of the driver's env (Python 3.12, jax, Ray worker settings) that must not leak into an engine env.
DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS")


ENGINE_KEY_ENV = "AHA_ENGINE_KEY"
"""The variable that hands an engine its API key (rollout/engine_ext/aha_engine_key.py reads it)."""

PORT_ATTEMPTS = 3
"""How many ports a server start tries when the one picked free is taken before the server binds it."""
PORT_IN_USE = re.compile(r"address already in use", re.IGNORECASE)  # errno 98's text, from vLLM's and uvicorn's bind


class PortTaken(RuntimeError):
    """The server exited during start-up because another process held its port."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on `host` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def engine_address(host: str | None, node_ip: str | None, driver_ip: str | None) -> tuple[str, str]:
    """(address the server binds, address the driver dials) for `rollout.backend.host` on an engine whose Ray node
    is `node_ip`, driven from `driver_ip` (None: not under Ray, i.e. the same host).

    A wildcard never becomes the dialled address, and a loopback bind on another node than the driver's is refused:
    the driver could not reach it (and the engine's own health check, on its loopback, would say it is fine).
    """
    same_node = node_ip is None or driver_ip is None or node_ip == driver_ip
    if host is None:
        return ("127.0.0.1", "127.0.0.1") if same_node else (node_ip, node_ip)
    if host in WILDCARD:
        return host, "127.0.0.1" if same_node else node_ip
    if host in LOOPBACK and not same_node:
        raise ValueError(f"rollout.backend.host {host} is loopback, but the engine runs on node {node_ip} and the "
                         f"driver on {driver_ip}, which cannot reach it; leave rollout.backend.host unset (the engine "
                         "then binds its node's address) or pin the engine to the driver's node")
    return host, host


def error_excerpt(lines: list[str], context: int = 30, tail: int = 8) -> str:
    """The first error report in `lines` (`context` lines from its start) and the last `tail` lines.

    A dying engine logs its root cause first; what follows is the shutdown's own noise (the API server's
    EngineDeadError, leaked semaphores, nanobind leak lists), which is all a plain tail shows. Without an error
    report the excerpt is the tail of `context + tail` lines.
    """
    first = next((i for i, line in enumerate(lines) if ERROR_LINE.search(line)), None)
    if first is None or first >= len(lines) - context - tail:
        return "".join(lines[-(context + tail):])
    return "".join([*lines[first:first + context], "[...]\n", *lines[-tail:]])


def kept_caches() -> dict[str, str]:
    """Caches an engine keeps under TMPDIR by default and should find again at its next start, where they are now:
    torch's compile cache (`torchinductor_<user>`, as torch names it), for an engine whose TMPDIR is per start."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")}


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ServerProcess:
    """Launch, watch, stop and control one engine server, and speak its dialect; subclasses define command() and
    their engine_env()."""

    engine_name = "engine"
    """Name used in logs and errors."""
    setup_hint = "run `bash scripts/setup_envs.sh`"
    """What to do when the engine's interpreter is missing."""
    control_timeout_s = 120.0
    """Timeout of control-plane calls (adapter load/unload)."""
    missing_ids_hint = ""
    """Added to the error for a response choice without token ids and logprobs (a likely cause)."""
    scratch_env: tuple[str, ...] = ()
    """The engine's variables for the folders of its per-start files (inter-process sockets, TMPDIR); empty: it
    keeps none. Each start gets a folder of its own, every one of these pointing at it, removed at stop(): an engine
    whose processes are killed leaves them behind (vLLM: a file per socket, named by a uuid, and a
    `vllm_dist_<uuid>` init file per start, in /tmp by default). Caches meant to outlive a start stay where they were
    (`kept_caches`)."""

    def __init__(self, cfg: Any, model_path: Path, workdir: Path | None = None):
        self.cfg = cfg
        self.model_path = Path(model_path)
        self.workdir = Path(workdir) if workdir else None
        self.base_url: str | None = None
        self.dial_host: str | None = None
        """Address clients dial (the node's address when the driver is elsewhere); None: the bind address, or
        loopback for a wildcard or unset bind."""
        self._proc: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._scratch: Path | None = None

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def engine_env(self, env: dict[str, str]) -> None:
        """Add the engine's own variables to `env` (the server's environment, before rollout.backend.env)."""

    def environment(self) -> dict[str, str]:
        """The server's environment: ours minus the driver's Python settings, the engine's own, then backend.env."""
        env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
        env.update({
            "HF_HUB_OFFLINE": "1",
            # Ray sets OMP_NUM_THREADS=1 in its workers, which would make a CPU engine single-threaded.
            "OMP_NUM_THREADS": str(self.cfg.threads),
            "PYTHONUNBUFFERED": "1",
            **self.cfg.affinity_env(),  # the entry program pins itself to rollout.backend.cpu_cores
        })
        self.engine_env(env)
        if self.cfg.api_key:  # by the environment (readable by the engine's user only), not argv (by every user)
            env[ENGINE_KEY_ENV] = self.cfg.api_key
        if self._scratch is not None:  # set only for an engine with a scratch_env
            if "TMPDIR" in self.scratch_env:  # caches that default under TMPDIR stay there, shared by every start
                env.update({k: v for k, v in kept_caches().items() if k not in env})
            env.update(dict.fromkeys(self.scratch_env, str(self._scratch)))
        env.update(self.cfg.env)
        return env

    def start(self) -> str:
        """Launch the server and block until /health answers; return base_url. Raises with the log tail.

        A port picked free here is bound by the server only once its imports are done, seconds later; another
        process can take it in between (an outgoing connection's local port, another server). The server then
        exits saying so, and it is started again on another port, up to PORT_ATTEMPTS times; a configured
        `port` is not changed."""
        if self._proc is not None and self._proc.poll() is None:
            return self.base_url
        if not self.cfg.interpreter.exists():
            raise FileNotFoundError(f"{self.engine_name} interpreter {self.cfg.interpreter} not found; "
                                    f"{self.setup_hint}")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"aha-{self.cfg.kind}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start_on(self.cfg.port or free_port(self.bind_host))
            except PortTaken as taken:
                if self.cfg.port:
                    raise
                log.warning("%s server on %s exited: a port it binds was taken by another process; starting it "
                            "again on another port (%s)", self.engine_name, self.base_url, str(taken).splitlines()[-1])
        return self._start_on(self.cfg.port or free_port(self.bind_host))

    def _start_on(self, port: int) -> str:
        self._drop_scratch()  # a server that died without stop(): its files go now
        if self.scratch_env:  # under /tmp, not the workdir: a socket's path must fit 107 bytes
            self._scratch = Path(tempfile.mkdtemp(prefix="aha-scratch-"))
        self._log_path = self.workdir / f"server-{port}-{int(time.time())}.log"
        log.info("starting %s on %s:%d (log %s)", self.engine_name, self.bind_host, port, self._log_path)
        with open(self._log_path, "ab") as out:
            self._proc = subprocess.Popen(self.command(port), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.environment(), cwd=self.workdir,
                                          start_new_session=True)
        dial = self.dial_host or ("127.0.0.1" if self.bind_host in WILDCARD else self.bind_host)
        self.base_url = f"http://{dial}:{port}"  # the health check below dials it too, as the driver will
        try:
            self._wait_healthy(port)
        except BaseException:
            self.stop()
            raise
        return self.base_url

    @property
    def bind_host(self) -> str:
        """The address the server listens on (loopback when the config leaves it to the actor and none decided)."""
        return self.cfg.host if self.cfg.host is not None else "127.0.0.1"

    def _wait_healthy(self, port: int) -> None:
        """Until the server we started answers /health 200 on `port`: an answer from another process that took the
        port first (rollout/port_owner.py) does not count; our server then exits on the taken port (PortTaken)."""
        deadline = time.monotonic() + self.cfg.start_timeout_s
        impostor = False
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log_tail()
                taken = PORT_IN_USE.search(tail) is not None
                why = f" (a port it binds was taken: {self.base_url} or one of its own)" if taken else ""
                raise (PortTaken if taken else RuntimeError)(
                    f"{self.engine_name} server exited with code {self._proc.returncode} during start-up{why}; last "
                    f"lines of {self._log_path}:\n{tail}")
            if self._healthy(timeout_s=2.0):
                if group_listens_on(self._proc.pid, port):
                    return
                if not impostor:
                    log.warning("%s: /health answers 200, but no process of the %s server started here listens on "
                                "port %d: another process holds it; waiting for ours", self.base_url,
                                self.engine_name, port)
                    impostor = True
            time.sleep(0.5)
        if impostor:
            raise RuntimeError(f"{self.engine_name} server never listened on port {port}: another process holds it "
                               f"and answers /health there; free the port or set another (read {self._log_path}):\n"
                               f"{self.log_tail()}")
        given = "set" if self.cfg.startup_timeout_s else f"the default for {self.cfg.kind} on {self.cfg.platform}"
        raise RuntimeError(f"{self.engine_name} server not healthy after {self.cfg.start_timeout_s:.0f} s ({given}); "
                           "raise rollout.backend.startup_timeout_s (judge_engine.backend.startup_timeout_s for a "
                           f"judge's engine) or read {self._log_path}:\n{self.log_tail()}")

    def _healthy(self, timeout_s: float) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def is_alive(self) -> bool:
        """Whether the process runs and /health answers 200."""
        return self._proc is not None and self._proc.poll() is None and self._healthy(timeout_s=5.0)

    def pid(self) -> int | None:
        """Process id of the server's first process, which is also its process group id."""
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
            if not group_alive(proc.pid):
                break
        self._drop_scratch()
        log.info("%s server %d stopped", self.engine_name, proc.pid)

    def _drop_scratch(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def _log_lines(self, n: int) -> list[str]:
        """The last n lines of the server log ([] before start)."""
        if self._log_path is None or not self._log_path.exists():
            return []
        with open(self._log_path, errors="replace") as f:
            return list(deque(f, maxlen=n))

    def log_tail(self, n: int = 50) -> str:
        """The last n lines of the server log ('' before start)."""
        return "".join(self._log_lines(n))

    def log_excerpt(self, context: int = 30, tail: int = 8) -> str:
        """Why a server died, from its log: the first error report and `tail` last lines ('' before start)."""
        lines = self._log_lines(20_000)
        return error_excerpt(lines, context, tail) if lines else ""

    def auth_headers(self) -> dict[str, str]:
        """The bearer header a server started with `api_key` requires on every route but /health."""
        return {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}

    def _control(self, route: str, body: dict[str, Any]) -> None:
        if self.base_url is None:
            raise RuntimeError(f"{route}: the {self.engine_name} server is not started; call start() first")
        try:
            resp = httpx.post(f"{self.base_url}{route}", json=body, headers=self.auth_headers(),
                              timeout=self.control_timeout_s)
        except httpx.HTTPError as e:
            raise RuntimeError(f"{route} failed ({e!r}); server log:\n{self.log_tail()}") from e
        if resp.status_code != 200:
            raise RuntimeError(f"{route} {body} -> {resp.status_code}: {resp.text.strip()[:500]}")

    # ---- wire format ---------------------------------------------------------------------------------------

    def build_payload(self, prompt: list[int], params: SamplingParams, lora_name: str | None) -> dict[str, Any]:
        """/v1/completions body: the prompt as token ids and every sampling field (n samples). Raises for a field
        this platform's engine would silently ignore or reject (rollout/capabilities.py)."""
        check_sampling(self.cfg, params)
        payload = params.to_payload()
        payload.update(model=lora_name or self.cfg.served_model_name, prompt=list(prompt), stream=False)
        return payload

    def parse_choice(self, choice: dict[str, Any]) -> tuple[list[int], list[float], dict[str, Any]]:
        """Ids from `token_ids`, logprobs from `logprobs.token_logprobs`; top logprobs and stop_reason as extra."""
        token_ids = choice.get("token_ids")
        lp = choice.get("logprobs") or {}
        logprobs = lp.get("token_logprobs")
        if token_ids is None or logprobs is None or len(token_ids) != len(logprobs):
            raise RuntimeError(f"{self.engine_name} response lacks matching token_ids and logprobs"
                               f"{self.missing_ids_hint}: {str(choice)[:300]}")
        extra = {"stop_reason": choice.get("stop_reason")}
        if any(lp.get("top_logprobs") or []):
            extra["top_logprobs"] = lp["top_logprobs"]
        if choice.get("prompt_logprobs") is not None:  # asked by `extra: {prompt_logprobs: k}` (vLLM)
            extra["prompt_logprobs"] = choice["prompt_logprobs"]
        return list(token_ids), [float(x) for x in logprobs], extra
