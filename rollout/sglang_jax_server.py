"""`SglangJaxBackend`: the SGLang-JAX engine behind the same contract as `VllmBackend` (`kind: sglang_jax`).

The server is `rollout/sglang_jax_entry.py` run by the SGLang-JAX env's interpreter (Python 3.12, sglang-jax 0.0.2,
jax 0.8): the engine in-process, wrapped in the `/health`, `/v1/completions`, `/v1/load_lora_adapter` subset of
vLLM's API that `rollout.client` speaks. Differences from vLLM that callers can see:

- a LoRA push merges the adapter into the base weights of the running engine (W0 + alpha/r * B @ A, always from
  W0), so exactly one adapter (or the base model) is live; requests for any other name are refused (404);
- `repetition_penalty` is not applied by the engine, and `seed` only with `deterministic_sampling: true`: requests
  asking for them are rejected here, before anything is sent, with a one-line error (`rollout/capabilities.py`);
- logprobs are those of the tempered distribution (after penalties and temperature, before top-k/top-p/min-p);
  with top_k = -1, top_p = 1, min_p = 0 that is vLLM's processed_logprobs.
"""

from __future__ import annotations

from pathlib import Path

from rollout.server_process import ServerProcess
from rollout.sglang_jax_config import SglangJaxConfig

ENTRY = Path(__file__).with_name("sglang_jax_entry.py")


class SglangJaxBackend(ServerProcess):
    """Launch, watch and stop one wrapped SGLang-JAX server; speak its completions dialect."""

    engine_name = "SGLang-JAX"
    scratch_env = ("TMPDIR",)  # its ZMQ IPC sockets are tempfile names (sgl_jax ServerArgs), never removed
    setup_hint = "run `bash scripts/setup_sglang_env.sh` or set rollout.backend.python"
    control_timeout_s = 300.0  # a merge of every weight takes seconds on CPU
    cfg: SglangJaxConfig

    # ---- control plane -------------------------------------------------------------------------------------

    def command(self, port: int) -> list[str]:
        """The server's command line."""
        import json

        c = self.cfg
        cmd = [
            # -P: keep rollout/ off sys.path (the entry puts the repo root there and imports `rollout.*` as a package).
            str(c.interpreter), "-P", str(ENTRY), "--model", str(self.model_path), "--workdir", str(self.workdir),
            "--host", self.bind_host, "--port", str(port), "--served-model-name", c.served_model_name,
            "--device", c.platform, "--dtype", c.dtype, "--max-model-len", str(c.max_model_len),
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
        if c.startup_adapter is not None:
            cmd += ["--adapter-name", c.startup_adapter.name, "--adapter-path", str(c.startup_adapter.path)]
        return cmd  # an API key goes by the environment (ServerProcess.environment), never argv

    def engine_env(self, env: dict[str, str]) -> None:
        """JAX on the configured CPU platform (the driver's JAX_PLATFORMS is dropped with its other settings)."""
        if self.cfg.platform == "cpu":
            env["JAX_PLATFORMS"] = "cpu"

    def load_lora(self, name: str, path: Path) -> None:
        """Merge the PEFT adapter in `path` into the live weights; later requests name it `name`."""
        self._control("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_lora(self, name: str) -> None:
        """Back to the base weights if `name` is live; a no-op for a name a newer version already replaced."""
        self._control("/v1/unload_lora_adapter", {"lora_name": name})

