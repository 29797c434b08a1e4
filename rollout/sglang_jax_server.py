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

import logging
import os
from pathlib import Path
from typing import Any

from rollout.capabilities import check_sampling
from rollout.server_process import DROP_ENV, ServerProcess
from rollout.sglang_jax_config import SglangJaxConfig
from rollout.sampling import SamplingParams

log = logging.getLogger(__name__)

ENTRY = Path(__file__).with_name("sglang_jax_entry.py")


class SglangJaxBackend(ServerProcess):
    """Launch, watch and stop one wrapped SGLang-JAX server; speak its completions dialect."""

    engine_name = "SGLang-JAX"
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
            "--host", c.host, "--port", str(port), "--served-model-name", c.served_model_name,
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
        if c.api_key:
            cmd += ["--api-key", c.api_key]
        return cmd

    def environment(self) -> dict[str, str]:
        """The server's environment: ours minus the driver's Python settings, plus the engine's."""
        env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
        threads = str(self.cfg.threads)
        env.update({
            "HF_HUB_OFFLINE": "1",
            # Ray sets OMP_NUM_THREADS=1 in its workers, which would make the CPU engine single-threaded.
            "OMP_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
            **self.cfg.affinity_env(),
        })
        if self.cfg.platform == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
        env.update(self.cfg.env)
        return env

    def load_lora(self, name: str, path: Path) -> None:
        """Merge the PEFT adapter in `path` into the live weights; later requests name it `name`."""
        self._control("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_lora(self, name: str) -> None:
        """Back to the base weights if `name` is live; a no-op for a name a newer version already replaced."""
        self._control("/v1/unload_lora_adapter", {"lora_name": name})

    # ---- wire format ---------------------------------------------------------------------------------------

    def build_payload(self, prompt: list[int], params: SamplingParams, lora_name: str | None) -> dict[str, Any]:
        """/v1/completions body of the wrapper; raises for sampling fields the engine would not honour."""
        check_sampling(self.cfg, params)
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

