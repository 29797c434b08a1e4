"""One typed config tree for a run: YAML in, dotted overrides, one readable line per mistake.

Each component owns its sub-config (`rollout.config`, `learner.config`, `rewards.config`, `orchestration.data`);
this module only composes them and checks the few rules that span two parts (validators check, never rewrite).
Nothing here imports jax or an engine, so `--help` and config errors are instant.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from learner.config import LearnerConfig
from orchestration.data import DataConfig
from orchestration.prepare_model import model_dir
from rewards.config import RewardsConfig
from rollout.config import RolloutConfig


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(Strict):
    path: str = "smollm2-135m-instruct"
    """HF folder of the base model, or the name of a model made by `orchestration.prepare_model`
    (`smollm2-135m-instruct`, `tiny-llama`), looked up under $AHA_CACHE/models."""

    @property
    def resolved_path(self) -> Path:
        path = Path(self.path).expanduser()
        if path.exists() or "/" in self.path:
            return path
        return model_dir(self.path)


class TrainConfig(Strict):
    steps: int = Field(20, ge=1)
    """GRPO steps to run (a resumed run continues up to this count)."""
    prompts_per_step: int = Field(4, ge=1)
    """Distinct prompts per step; each is sampled rollout.sampling.n times (the GRPO group)."""
    mode: Literal["sync", "async"] = "sync"
    """sync: generate, then learn. async: generation of step k+1 overlaps the update of step k (staleness 1);
    samples carry the adapter version that made them and the learner's importance correction accounts for it."""
    save_every: int = Field(10, ge=0)
    """Checkpoint every N steps (0 = only at the end)."""
    seed: int = 0
    """Seed for the engine's sampling (per request, offset by step) and anything else random in the loop."""
    run_dir: str = "runs/{name}-{time}"
    """Where metrics, checkpoints, adapters and plots go; {name} is the config file's stem, {time} a timestamp."""


class WandbConfig(Strict):
    project: str = "aha"
    """W&B project the run is logged under."""
    mode: Literal["offline", "online", "disabled"] = "offline"
    """offline: write run_dir/wandb/offline-run-*/ only (upload later with `wandb sync`); online: stream to the
    W&B server (needs `wandb login` or WANDB_API_KEY); disabled: a no-op run (keeps the code path, logs nothing)."""
    entity: str | None = None
    """W&B team or user (None: the logged-in user's default)."""
    name: str | None = None
    """Display name of the run (None: the run directory's name)."""


class EvalConfig(Strict):
    every: int = Field(0, ge=0)
    """Score the held-out prompts every N steps and at the last step (0 = never), through the training engine with
    the adapter just pushed (no second server); logs eval/accuracy, eval/pass@k, eval/reward. Costs prompts x k
    samples of generation per eval."""
    prompts: int = Field(32, ge=1)
    """Held-out prompts per eval: the first N of the eval split (at most data.eval_size)."""
    k: int = Field(4, ge=1)
    """Samples per prompt: accuracy is over all samples, pass@k over prompts."""
    temperature: float | None = Field(None, ge=0.0)
    """Sampling temperature of the eval (None: rollout.sampling.temperature); 0 = greedy, with k = 1."""
    max_tokens: int | None = Field(None, ge=1)
    """Most new tokens per eval sample (None: rollout.sampling.max_tokens)."""


class LoggingConfig(Strict):
    wandb: WandbConfig | None = None
    """Also log every metric to Weights & Biases (None = off); needs the wandb package in the learner env."""
    tensorboard: bool = True
    """Also write TensorBoard event files (tensorboardX) into run_dir/tb."""
    progress: Literal["auto", "on", "off"] = "auto"
    """Progress bar with ETA on stderr; auto = only when stderr is a terminal."""
    plots: bool = True
    """Write PNG plots of reward and completion length per step at the end of the run."""


class RayConfig(Strict):
    address: str | None = None
    """Ray cluster to join. None: join the cluster of `ray job submit` (RAY_ADDRESS) if set, else start a local one."""
    num_cpus: int | None = None
    """Logical CPUs of a locally started cluster (None: enough for the actors this config asks for)."""


class RunConfig(Strict):
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig
    learner: LearnerConfig = LearnerConfig()
    rewards: RewardsConfig
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    logging: LoggingConfig = LoggingConfig()
    eval: EvalConfig = EvalConfig()
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def check_group_size(self) -> "RunConfig":
        if self.rollout.sampling.n < 2:
            raise ValueError(
                f"rollout.sampling.n ({self.rollout.sampling.n}) must be >= 2: GRPO compares samples of one prompt, "
                "and with one sample every advantage is 0"
            )
        return self

    @model_validator(mode="after")
    def check_eval(self) -> "RunConfig":
        e = self.eval
        if e.every and e.prompts > self.data.eval_size:
            raise ValueError(f"eval.prompts ({e.prompts}) exceeds data.eval_size ({self.data.eval_size}); "
                             "lower eval.prompts or raise data.eval_size")
        temperature = self.rollout.sampling.temperature if e.temperature is None else e.temperature
        if e.every and e.k > 1 and temperature == 0:
            raise ValueError(f"eval.k ({e.k}) > 1 at temperature 0 gives identical greedy samples; set eval.k: 1")
        return self

    @model_validator(mode="after")
    def check_lora_fits_engine(self) -> "RunConfig":
        backend = self.rollout.backend
        if getattr(backend, "enable_lora", True) and self.learner.lora.rank > getattr(backend, "max_lora_rank", 1 << 30):
            raise ValueError(
                f"learner.lora.rank ({self.learner.lora.rank}) exceeds rollout.backend.max_lora_rank "
                f"({backend.max_lora_rank}): the server would refuse the adapter; raise max_lora_rank or lower the rank"
            )
        return self

    @model_validator(mode="after")
    def check_logprob_semantics(self) -> "RunConfig":
        # The importance correction compares learner and engine logprobs of the same distribution.
        s = self.rollout.sampling
        truncated = s.top_k > 0 or s.top_p < 1.0 or s.min_p > 0.0
        if self.rollout.backend.kind == "sglang_jax" and truncated and self.learner.grpo.is_cap is not None:
            # SGLang-JAX reports logprobs after temperature but before top-k/top-p/min-p truncation.
            raise ValueError(
                "rollout.backend.kind sglang_jax returns logprobs before top_k/top_p/min_p truncation, so the "
                "importance correction would compare different distributions; use top_k=-1, top_p=1, min_p=0 "
                "with sglang_jax, or set learner.grpo.is_cap: null"
            )
        mode = getattr(self.rollout.backend, "logprobs_mode", None)
        want = {"processed": "processed_logprobs", "raw": "raw_logprobs"}[self.learner.grpo.engine_logprobs]
        if mode is not None and mode != want:
            raise ValueError(
                f"rollout.backend.logprobs_mode ({mode}) does not match learner.grpo.engine_logprobs "
                f"({self.learner.grpo.engine_logprobs}); set logprobs_mode: {want}"
            )
        return self

    @property
    def group_size(self) -> int:
        return self.rollout.sampling.n


class ConfigError(ValueError):
    """A config mistake, already formatted as one line per problem."""


def _parse_scalar(text: str) -> Any:
    # YAML rules for override values, so `lr=1e-5`, `x=true`, `stop=["a","b"]` and `name=null` behave as in files.
    return yaml.safe_load(text)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` overrides to a nested dict (creating missing levels)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. learner.optimizer.lr=1e-5)")
        key, value = item.split("=", 1)
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_scalar(value)
    return raw


def _did_you_mean(model: type[BaseModel] | None, loc: tuple) -> str:
    """Suggest the closest known key for an unknown one, walking the model tree along `loc`."""
    fields: dict = getattr(model, "model_fields", {})
    for part in loc[:-1]:
        info = fields.get(part) if isinstance(part, str) else None
        annotation = getattr(info, "annotation", None)
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")]
        if not candidates:
            return ""
        fields = {k: v for c in candidates for k, v in c.model_fields.items()}
    close = difflib.get_close_matches(str(loc[-1]), list(fields), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def format_validation_error(err: ValidationError) -> str:
    """One line per problem: `learner.optimizer.lr: Input should be greater than 0 (got -1)`."""
    lines = []
    for entry in err.errors():
        loc = tuple(p for p in entry["loc"] if not (isinstance(p, str) and p in {"vllm", "sglang_jax"}))
        path = ".".join(str(p) for p in loc) or "<root>"
        if entry["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key{_did_you_mean(RunConfig, loc)}")
            continue
        msg = entry["msg"].removeprefix("Value error, ")
        got = f" (got {entry['input']!r})" if entry["type"] != "missing" and not isinstance(entry["input"], dict) else ""
        lines.append(f"{path}: {msg}{got}" if loc else msg)
    return "\n".join(lines)


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read YAML, apply dotted overrides, validate. Raises ConfigError with readable lines."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} not found (shipped configs are in configs/)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections (model, rollout, learner, ...)")
    raw = apply_overrides(raw, overrides or [])
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def dump_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config (every default filled in) so a run can be resumed or reproduced from it."""
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
