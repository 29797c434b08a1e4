"""The contract every rollout engine implements, and the factory that picks one from `backend.kind`.

A backend has two halves, one Protocol each:
- `EngineProcess`, the control plane (lives in the RolloutServer actor): start/stop the server process, liveness,
  log tail, load/unload a LoRA adapter from a local folder;
- `WireFormat`, the codec (pure, usable on an unstarted backend, so the driver-side client can use it): the request
  headers and payload for a prompt, and how a response choice maps to token ids and logprobs.
The data plane (sending generate requests) is `rollout.client.RolloutClient`, shared by all backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from rollout.config import BackendConfig
from common.sampling import SamplingParams


class EngineProcess(Protocol):
    """Process control: one inference server process, its liveness, logs and adapters (in the RolloutServer actor)."""

    base_url: str | None
    """http://host:port of the running server; None before start()."""

    def start(self) -> str:
        """Launch the server, block until healthy, return base_url; raise with the server's log tail on failure."""
        ...

    def stop(self) -> None:
        """Stop the server and all its children; idempotent."""
        ...

    def is_alive(self) -> bool:
        """Whether the process runs and answers its health check."""
        ...

    def pid(self) -> int | None:
        """Process (group) id of the server, None when not started."""
        ...

    def log_tail(self, n: int = 50) -> str:
        """The last n lines of the server's log."""
        ...

    def log_excerpt(self) -> str:
        """Why the server died, from its log: its first error report and its last lines."""
        ...

    def load_lora(self, name: str, path: Path) -> None:
        """Register the PEFT adapter in `path` under `name` (replacing one of that name); later requests may use it."""
        ...

    def unload_lora(self, name: str) -> None:
        """Unregister an adapter; its folder may be deleted afterwards (not before: the engine re-reads it)."""
        ...


class WireFormat(Protocol):
    """The wire codec: pure functions of the config, usable on an unstarted backend (the driver's client uses them)."""

    def auth_headers(self) -> dict[str, str]:
        """Headers every request but /health needs: the bearer token of a server started with `api_key`, else none."""
        ...

    def build_payload(self, prompt: list[int], params: SamplingParams, lora_name: str | None) -> dict[str, Any]:
        """The completions request body for one prompt (n samples), with the engine's quirks applied."""
        ...

    def parse_choice(self, choice: dict[str, Any]) -> tuple[list[int], list[float], dict[str, Any]]:
        """(completion token ids, sampled-token logprobs, extra detail) of one response choice."""
        ...


class RolloutBackend(EngineProcess, WireFormat, Protocol):
    """One engine: its process and its wire format (`rollout.server_process.ServerProcess` writes both once)."""


def setup_backend(cfg: BackendConfig, model_path: Path, workdir: Path | None = None) -> RolloutBackend:
    """The backend for `cfg.kind`, not started; `workdir` holds its logs (default: a new temporary folder)."""
    match cfg.kind:
        case "vllm":
            from rollout.vllm_server import VllmBackend

            return VllmBackend(cfg, model_path, workdir)
        case "sglang_jax":
            from rollout.sglang_jax_server import SglangJaxBackend

            return SglangJaxBackend(cfg, model_path, workdir)
        case _:  # unreachable while the union validates `kind`; kept for the next engine
            raise ValueError(f"rollout.backend.kind {cfg.kind!r} has no backend; use 'vllm' or 'sglang_jax'")
