"""The schema of a run's one typed config tree.

Each component owns its sub-config (`rollout.config`, `learner.config`, `rewards.config`, `tasks`);
this module only composes them and checks the few rules that span two parts (validators check, never rewrite).
YAML in and out with dotted overrides: orchestration/config/files.py; one readable line per mistake:
orchestration/config/errors.py. Nothing here imports jax or an engine, so `--help` and config errors are instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from learner.config import LearnerConfig
from tasks import DataConfig
from tasks.environments.config import EnvironmentConfig
from orchestration.config.parallelism import check_engine_chips, check_learner_chips
from common.hf_cache import hf_id_of
from common.model_cache import model_dir
from rewards.config import RewardsConfig
from rollout.capabilities import check_lora_env, check_platform_resources, check_sampling, engine_caps, logprobs_mode
from rollout.config import BackendConfig, ClientConfig, RolloutConfig, VllmConfig
from common.sampling import OFF, PENALTIES, SamplingParams, active, needs_history
from common.strict import Strict

REPO = Path(__file__).resolve().parents[2]


class ModelConfig(Strict):
    path: str = "smollm2-135m-instruct"
    """HF folder of the base model, or the name of a model made by `orchestration.cli.prepare_model`
    (`smollm2-135m-instruct`, `tiny-llama`), looked up under $AHA_CACHE/models."""
    hf_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """The model's Hugging Face id (ORG/NAME): the name `aha tinker` serves it by and its clients load the tokenizer
    by. None: the folder says it (the `hf_id.txt` setup writes into the models it prepares, or the folder's place in
    a Hugging Face cache); set it for a folder that says neither (docs/tinker.md, "One model name")."""

    @property
    def resolved_path(self) -> Path:
        path = Path(self.path).expanduser()
        if path.exists() or "/" in self.path:
            return path
        return model_dir(self.path)

    @property
    def config_json(self) -> Path | None:
        """The model's config.json (architecture, head counts): in its folder, else the copy shipped under
        configs/models/<folder name>/ (the TPU configs' models, whose weights live on the TPU VM); None if neither."""
        for path in (self.resolved_path / "config.json", REPO / "configs" / "models" / Path(self.path).name /
                     "config.json"):
            if path.exists():
                return path
        return None

    @property
    def resolved_hf_id(self) -> str | None:
        """`hf_id`, else the one its folder says; None if neither."""
        return self.hf_id or hf_id_of(self.resolved_path)


class DynamicSamplingConfig(Strict):
    """DAPO's dynamic sampling: fill each step's batch with groups whose rewards differ
    (orchestration/dynamic_sampling.py)."""

    enabled: bool = False
    """Draw more prompts until train.prompts_per_step groups with unequal rewards are in hand (a group whose samples
    all score the same has advantage 0 under every GRPO variant: it teaches nothing), at most `max_draws` draws per
    step; surplus varying groups are dropped. Off: every drawn group is trained on (see also
    learner.grpo.skip_zero_variance_groups, which drops constant groups without drawing new ones)."""
    max_draws: int = Field(4, ge=1)
    """Most draws per step, the first included. The first draws train.prompts_per_step prompts; each refill draws
    the groups still missing divided by the share of drawn groups that varied so far this step (at most
    train.prompts_per_step). When the bound is reached short of a full batch, the step trains on the varying groups
    it has (`dynamic/kept_groups` < prompts_per_step), or on its first draw if none varied."""


class TrainConfig(Strict):
    steps: int = Field(20, ge=1)
    """GRPO steps to run (a resumed run continues up to this count)."""
    prompts_per_step: int = Field(4, ge=1)
    """Distinct prompts per step; each is sampled rollout.sampling.n times (the GRPO group)."""
    mode: Literal["sync", "async"] = "sync"
    """sync: generate, then learn. async: generation of the next steps overlaps the update of step k; samples carry
    the adapter version that made them and the learner's importance correction accounts for it."""
    max_staleness: int = Field(1, ge=1)
    """async only: generate at most this many steps ahead, so a sample's adapter is at most this many versions
    behind the update that learns from it (1 = generation of step k+1 overlaps the update of step k)."""
    save_every: int = Field(10, ge=0)
    """Checkpoint every N steps (0 = only at the end)."""
    seed: int = 0
    """Seed of the engine's sampling: each request's seed comes from (seed, step, prompt index), so a resumed run
    draws the samples an uninterrupted one would (engines that take seeds: vLLM, SGLang-JAX with deterministic
    sampling)."""
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    """Refill each step's batch with groups whose rewards vary (DAPO); off by default."""
    run_dir: str = "runs/{name}-{time}"
    """Where metrics, checkpoints, adapters and plots go; {name} is the config file's stem, {time} a timestamp.
    A local path, or shared storage every host reads (`gs://bucket/runs/{name}-{time}`): on a Ray cluster of several
    nodes a local path is refused unless `run_dir_shared` says every node mounts it."""
    run_dir_shared: bool = False
    """The run directory is a local path that every node of the cluster mounts at the same place (NFS, a shared
    disk): allow it on a multi-node cluster, where the learner writes checkpoints on its own host."""


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


# What the learner applies before its logprobs when they are "processed" (learner/sampling.py `SamplingTransform`,
# vLLM's order): min_tokens masking, repetition/presence/frequency penalties, temperature, min-p, top-k, top-p.
# (Penalties need learner.logprob_chunk > 0; `check_sampling_is_modelled` refuses them with the dense reference.)
LEARNER_TRANSFORMS = frozenset({"min_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty",
                                "temperature", "min_p", "top_k", "top_p"})


def check_same_transform(backend, sampling: SamplingParams) -> None:
    """Raise unless the engine's processed logprobs and the learner's apply the same active transforms."""
    caps = engine_caps(backend)
    engine = caps.logprob_modes["processed_logprobs"]
    for name in active(sampling):
        if name in engine and name not in LEARNER_TRANSFORMS:
            why = f"{caps.engine} takes its logprobs after {name} and the learner does not reproduce it"
        elif name in LEARNER_TRANSFORMS and name not in engine:
            why = f"{caps.engine} takes its logprobs before {name} and the learner after it"
        else:
            continue
        raise ValueError(f"rollout.sampling.{name} ({getattr(sampling, name)}): {why}, so the importance "
                         f"correction (learner.grpo.correction) would correct against another distribution; set "
                         f"rollout.sampling.{name}: {OFF[name]} or turn the correction off (learner.grpo.correction: "
                         "tis, learner.grpo.is_cap: null)")


class ActorResources(Strict):
    """What Ray reserves for one actor of a part: one learner host, or one engine replica. The driver places the
    parts (orchestration/cluster/placement.py, resources.py), so their resources are its keys, not the parts' own."""

    num_cpus: float = Field(1.0, ge=0)
    """Ray CPUs (an engine's threads are set by rollout.backend.cpu_threads)."""
    num_gpus: float = Field(0.0, ge=0)
    """Ray GPUs."""
    tpu: float = Field(0.0, ge=0)
    """Ray `TPU` resource (chips); inside the actor `jax.devices()` are then those chips."""
    custom: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per actor, to pin a part to chosen nodes: start a node with
    `ray start --resources='{"engine_host": 1}'` and set `rollout.resources.custom: {engine_host: 1}`; each actor
    then runs only on a node that still has that much of it (one per node at 1 of 1). Names are yours (not CPU,
    GPU, TPU: those are the keys above)."""

    @model_validator(mode="after")
    def _check_custom(self) -> "ActorResources":
        for name, amount in self.custom.items():
            if name in ("CPU", "GPU", "TPU", "memory", "object_store_memory") or amount <= 0:
                raise ValueError(f"resources.custom {{{name}: {amount}}}: custom resources need a name of your own and "
                                 "an amount > 0 (CPUs, GPUs and chips are num_cpus, num_gpus, tpu)")
        return self

    def ray_options(self) -> dict[str, Any]:
        """`actor.options(...)` keywords."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        resources = {**({"TPU": self.tpu} if self.tpu else {}), **self.custom}
        if resources:
            options["resources"] = resources
        return options


class RolloutSection(RolloutConfig):
    """`rollout:`: the rollout part's config, plus the Ray resources of each engine server actor."""

    resources: ActorResources = ActorResources()
    """Ray resources of each server actor (one per replica)."""

    @model_validator(mode="after")
    def _check_platform(self) -> "RolloutSection":
        # A platform that contradicts the devices the actor asks Ray for (rollout/capabilities.py), and what the
        # platform's engine needs to serve LoRA adapters.
        check_platform_resources(self.backend, self.resources.num_gpus, self.resources.tpu)
        check_lora_env(self.backend)
        return self


class LearnerSection(LearnerConfig):
    """`learner:`: the learner's config, plus the Ray resources of each learner process (one per host)."""

    resources: ActorResources = ActorResources()
    """What Ray reserves for each learner actor (one per host)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of every learner process (e.g. LIBTPU_INIT_ARGS), set before it imports JAX and
    applied last, over the JAX cache variables and the TPU chip variables the driver computes
    (orchestration/cluster/tpu_env.py)."""


class JudgeEngineSection(Strict):
    """`judge_engine:`: the separate engine of a `judge` reward term with `engine: judge` (its own model and server,
    behind its own RolloutServer actor; orchestration/judge.py)."""

    model: ModelConfig
    """The judge's model (a HF folder or a prepared model's name, as `model.path`)."""
    backend: BackendConfig = Field(default_factory=lambda: VllmConfig(enable_lora=False))
    """The judge engine's launch settings (`kind` picks the engine); it serves the base model only."""
    client: ClientConfig = ClientConfig()
    """HTTP client of the judge's requests (max_concurrency bounds the judge requests in flight)."""
    resources: ActorResources = ActorResources()
    """Ray resources of the judge's server actor."""

    @model_validator(mode="after")
    def _check_platform(self) -> "JudgeEngineSection":
        check_platform_resources(self.backend, self.resources.num_gpus, self.resources.tpu)
        return self


def part_config(section: BaseModel, part: type[BaseModel]) -> Any:
    """What the part itself receives (a `RolloutConfig` or a `LearnerConfig`): the section without the driver's keys,
    so nothing of orchestration travels into the part's processes."""
    return part.model_construct(**{name: getattr(section, name) for name in part.model_fields})


class RunConfig(Strict):
    model: ModelConfig = ModelConfig()
    """The base model."""
    rollout: RolloutSection
    """The inference engine that samples (rollout/config.py) and the Ray resources of its servers."""
    learner: LearnerSection = LearnerSection()
    """The LoRA learner (learner/config.py) and the Ray resources of its processes."""
    rewards: RewardsConfig | None = None
    """The weighted rewards (rewards/config.py); none: an environment's own rewards only."""
    data: DataConfig = DataConfig()
    """The task's prompts (tasks/config.py)."""
    environment: EnvironmentConfig | None = None
    """A multi-turn environment (tasks/environments/): each sample is an episode of model turns and its replies (None:
    one completion)."""
    train: TrainConfig = TrainConfig()
    """The loop: steps, prompts per step, sync or async, checkpoints, seeds, the run directory."""
    logging: LoggingConfig = LoggingConfig()
    """Where metrics go besides metrics.jsonl."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation during training."""
    ray: RayConfig = RayConfig()
    """The Ray cluster to join or start."""
    judge_engine: JudgeEngineSection | None = None
    """The separate engine of a `judge` reward term with `engine: judge`; None when no term asks for one."""

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
        d = self.data
        if e.every and d.task == "dataset" and not d.eval_path and not d.eval_fraction:
            raise ValueError("eval.every needs held-out rows: set data.eval_fraction (e.g. 0.05) or data.eval_path")
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
    def check_engine_logprobs_match_learner(self) -> "RunConfig":
        # The learner's logprob convention must be the engine's (rollout/capabilities.py says where each engine
        # takes its logprobs); with the importance correction on, the two must also be of the same distribution.
        backend, grpo = self.rollout.backend, self.learner.grpo
        mode = logprobs_mode(backend)
        want = {"processed": "processed_logprobs", "raw": "raw_logprobs"}[grpo.engine_logprobs]
        if mode != want:
            fix = f"set rollout.backend.logprobs_mode: {want}" if engine_caps(backend).fixed_mode is None else \
                f"set learner.grpo.engine_logprobs: {mode.removesuffix('_logprobs')}"
            raise ValueError(f"rollout.backend.kind {backend.kind} returns {mode} but learner.grpo.engine_logprobs "
                             f"is {grpo.engine_logprobs}; {fix}")
        if grpo.corrects_engine and mode == "processed_logprobs":
            check_same_transform(backend, self.rollout.sampling)
        return self

    @model_validator(mode="after")
    def check_sampling_is_modelled(self) -> "RunConfig":
        # The learner models temperature, min-p, top-k, top-p, penalties and min_tokens (learner/sampling.py);
        # anything else that changes the engine's processed logprobs would bias the importance correction.
        s, learner = self.rollout.sampling, self.learner
        unmodelled = sorted({"logit_bias", "bad_words", "allowed_token_ids", "logits_processors"} & set(s.extra))
        if unmodelled and learner.grpo.corrects_engine:
            raise ValueError(f"rollout.sampling.extra sets {unmodelled}, which the learner does not model, so the "
                             "importance correction would compare different distributions; remove them or turn the "
                             "correction off (learner.grpo.correction: tis, learner.grpo.is_cap: null)")
        if needs_history(s) and learner.logprob_chunk == 0:
            raise ValueError("rollout.sampling sets penalties or min_tokens, which learner.logprob_chunk: 0 (the "
                             "dense reference) does not model; set learner.logprob_chunk > 0 (e.g. 128)")
        return self

    @model_validator(mode="after")
    def check_parallelism(self) -> "RunConfig":
        # The learner's chips against its topology, the engine's against its tensor parallelism and the model's
        # heads (orchestration/config/parallelism.py): rules Ray, libtpu and vLLM would apply minutes into the run.
        check_learner_chips(self.learner.topology, self.learner.hosts, self.learner.resources.tpu)
        check_engine_chips(self.rollout.backend, self.rollout.resources.tpu, self.model.config_json)
        return self

    @model_validator(mode="after")
    def check_multi_turn(self) -> "RunConfig":
        if self.environment is None:
            if self.rewards is None:
                raise ValueError("rewards: missing; give reward terms (or an environment, whose episodes score "
                                 "themselves)")
            return self
        # The learner models history-dependent processing over one completion (learner/logprobs.py counts the
        # completion's earlier tokens); across turns the engine's history also holds the environment's tokens.
        s = self.rollout.sampling
        if needs_history(s):
            on = next(name for name in active(s) if name in PENALTIES)
            raise ValueError(f"rollout.sampling.{on} is modelled by the learner for one turn only; turn it off "
                             "for a multi-turn environment (or drop the environment)")
        if self.environment.max_episode_tokens >= self.rollout.backend.max_model_len:
            raise ValueError(f"environment.max_episode_tokens ({self.environment.max_episode_tokens}) leaves no room "
                             f"for the opening in rollout.backend.max_model_len ({self.rollout.backend.max_model_len});"
                             " lower it or raise max_model_len")
        return self

    @model_validator(mode="after")
    def check_judge(self) -> "RunConfig":
        # The judge term's engine must exist, and take the judge's sampling (rollout/capabilities.py).
        terms = self.rewards.terms if self.rewards is not None else []
        index, judge = next(((i, t) for i, t in enumerate(terms) if t.name == "judge"), (None, None))
        wants = judge.params.get("engine", "policy") if judge is not None else None
        if wants == "judge" and self.judge_engine is None:
            raise ValueError(f"rewards.terms[{index}] (judge) has engine: judge but there is no judge_engine section; "
                             "add judge_engine: {model: {path: ...}} or set its engine: policy")
        if self.judge_engine is not None and wants != "judge":
            raise ValueError("judge_engine is set but no judge reward term has engine: judge, so it would start an "
                             "engine nobody asks; remove judge_engine or set the term's engine: judge")
        if judge is not None:
            from rewards.judge import JudgeParams

            sampling = JudgeParams(**judge.params).sampling
            backend = self.judge_engine.backend if wants == "judge" else self.rollout.backend
            where = f"rewards.terms[{index}].params.sampling"
            check_sampling(backend, sampling, where)
            if sampling.max_tokens >= backend.max_model_len:
                raise ValueError(f"{where}.max_tokens ({sampling.max_tokens}) leaves no room for the rubric in the "
                                 f"judge's max_model_len ({backend.max_model_len}); lower it")
        return self


class ApiConfig(Strict):
    """The Tinker API's limits (`aha tinker` only): what the server takes before it asks clients to wait."""

    max_pending_ops: int = Field(256, ge=1)
    """Operations (training ops and samples of every client) queued or running at once; one more is answered 429
    and polls of the queued ones say `paused_capacity`, so the SDK backs off and resubmits instead of piling up."""
    max_body_mb: float = Field(1024, gt=0)
    """Largest request body taken, in MiB; a bigger one is refused (413) naming this key."""
    min_checkpoint_ttl_s: int = Field(3600, ge=1)
    """Shortest `ttl_seconds` a checkpoint may be given (at save or by `set_checkpoint_ttl`); Tinker's is an hour.
    A checkpoint past its expiry is deleted, its folder and its record."""
    checkpoint_sweep_s: float = Field(60, gt=0)
    """How often the server deletes expired checkpoints of every run (a listing of a run deletes its own at once)."""
    gather_window_s: float = Field(0.02, ge=0)
    """How long a forward_backward that finds the learner idle waits for other clients' to share its pass
    (orchestration/service/passes.py); requests arriving while a pass runs share the next one anyway. 0 = none."""


class ServiceConfig(Strict):
    """What `aha tinker` reads (configs/tinker_*.yaml): the parts a training service runs. What a step trains on,
    its rewards and its loop are the client's, so there are no data, rewards, train or eval sections."""

    model: ModelConfig = ModelConfig()
    """The base model every training client's LoRA sits on."""
    rollout: RolloutSection
    """The engines that serve the samplers (a request's sampling parameters are its own: `sampling` is unused)."""
    learner: LearnerSection = LearnerSection()
    """The learner every training client's adapter lives on (its lora and optimizer keys are the run defaults;
    each client brings its own rank and AdamW numbers)."""
    ray: RayConfig = RayConfig()
    """The Ray cluster to join or start."""
    api: ApiConfig = ApiConfig()
    """The Tinker API's queue depth, body cap and checkpoint expiry."""

    judge_engine: None = None  # the cluster launcher reads it (a service starts no judge)

    @model_validator(mode="before")
    @classmethod
    def check_engine_serves_tinker(cls, data: Any) -> Any:
        """Refuse an engine the service cannot run on, before its other keys are read: SGLang-JAX's keys differ
        from vLLM's, so the config's vLLM keys would otherwise read as "unknown key" lines that hide the reason."""
        backend = data.get("rollout", {}).get("backend", {}) if isinstance(data, dict) else {}
        if isinstance(backend, dict) and backend.get("kind") == "sglang_jax":
            raise ValueError(
                "rollout.backend.kind (sglang_jax): `aha tinker` cannot serve on SGLang-JAX: its engine holds one "
                "LoRA merged into the base weights at a time (the service serves every training client's sampler "
                "versions at once) and returns no prompt or top-k logprobs (compute_logprobs, "
                "include_prompt_logprobs, topk_*_logprobs); serve with rollout.backend.kind: vllm")
        return data

    @model_validator(mode="after")
    def check_parallelism(self) -> "ServiceConfig":
        check_learner_chips(self.learner.topology, self.learner.hosts, self.learner.resources.tpu)
        check_engine_chips(self.rollout.backend, self.rollout.resources.tpu, self.model.config_json)
        return self

