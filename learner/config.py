"""The learner's typed config: mesh, device slice, hosts, LoRA, optimizer and GRPO options.

The learner receives only this sub-tree (`Learner(cfg.learner, model_path)`). Defaults are the CPU demo's
(SmolLM2-135M, fp32, one device); a TPU slice changes `devices`, `mesh`, `param_dtype` (and the driver's
`learner.resources`) only.
Importing this module never imports JAX, so config errors are instant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.strict import Strict

LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class DevicesConfig(Strict):
    offset: int = Field(0, ge=0)
    """Index of the learner's first device in `jax.devices()`; the rollout engine may own the ones before it."""
    count: int = Field(-1, ge=-1)
    """How many devices from `offset` the learner owns; -1 = all the rest."""


class MeshConfig(Strict):
    axis_names: tuple[str, ...] = ("fsdp", "tp")
    """Mesh axis names. Tunix's sharding rules name 'fsdp' (params and batch) and 'tp' (heads/hidden), so both
    must be present; extra axes get size 1 unless set."""
    axis_sizes: tuple[int, ...] = (-1, 1)
    """One size per axis; one of them may be -1 = the devices left over."""

    @model_validator(mode="after")
    def _check(self) -> MeshConfig:
        if len(self.axis_names) != len(self.axis_sizes):
            raise ValueError(f"mesh.axis_names {self.axis_names} and mesh.axis_sizes {self.axis_sizes} differ in length")
        missing = {"fsdp", "tp"} - set(self.axis_names)
        if missing:
            raise ValueError(f"mesh.axis_names {self.axis_names} lacks {sorted(missing)}: Tunix's models shard on them")
        if sum(s == -1 for s in self.axis_sizes) > 1 or any(s == 0 or s < -1 for s in self.axis_sizes):
            raise ValueError(f"mesh.axis_sizes {self.axis_sizes}: sizes are >= 1 with at most one -1")
        return self


class LoraConfig(Strict):
    rank: int = Field(16, ge=1)
    """LoRA rank r."""
    alpha: float = Field(32.0, gt=0)
    """LoRA alpha; the update is scaled by alpha / rank (PEFT's convention, exported as lora_alpha)."""
    target_modules: tuple[str, ...] = LLAMA_PROJECTIONS
    """HF projection names that get LoRA (PEFT's target_modules)."""

    @model_validator(mode="after")
    def _check(self) -> LoraConfig:
        unknown = set(self.target_modules) - set(LLAMA_PROJECTIONS)
        if unknown or not self.target_modules:
            raise ValueError(f"lora.target_modules {self.target_modules}: choose among {list(LLAMA_PROJECTIONS)}")
        return self


class OptimizerConfig(Strict):
    lr: float = Field(2e-5, gt=0)
    """AdamW learning rate (after warm-up)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up, in optimizer updates."""
    b1: float = Field(0.9, ge=0, lt=1)
    """Adam first-moment (momentum) decay."""
    b2: float = Field(0.99, ge=0, lt=1)
    """Adam second-moment decay; 0.99 is common in RL (few, noisy updates)."""
    eps: float = Field(1e-8, gt=0)
    """Added to Adam's second-moment root, for stability."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay on the LoRA weights."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; None = no clipping."""
    schedule: Literal["constant", "cosine"] = "constant"
    """The learning rate after warm-up: constant, or a cosine decay from lr to final_lr_ratio x lr over
    decay_steps optimizer updates (then held there)."""
    decay_steps: int = Field(0, ge=0)
    """Optimizer updates of the cosine decay after warm-up (one per step with the default mini-batching: usually
    train.steps - warmup_steps)."""
    final_lr_ratio: float = Field(0.1, ge=0, le=1)
    """The cosine schedule's last learning rate, as a fraction of lr."""

    @model_validator(mode="after")
    def _check(self) -> OptimizerConfig:
        if self.schedule == "cosine" and self.decay_steps == 0:
            raise ValueError("optimizer.schedule cosine needs optimizer.decay_steps > 0 (the updates it decays over, "
                             "e.g. train.steps - warmup_steps)")
        return self


class GrpoConfig(Strict):
    std_normalize: bool = True
    """Divide group-centred rewards by the group std (GRPO); False = Dr. GRPO (mean-centred only)."""
    clip_eps_low: float = Field(0.2, ge=0, lt=1)
    """PPO ratio clip below: 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.28, ge=0)
    """PPO ratio clip above: 1 + clip_eps_high (DAPO clip-higher; set equal to clip_eps_low for plain PPO)."""
    kl_beta: float = Field(0.0, ge=0)
    """KL-to-reference coefficient; 0 = no reference forward at all."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k2"
    """KL term in the loss, d = logp - ref on samples of the policy: k1 = d, k2 = d^2 / 2,
    k3 = exp(-d) + d - 1 (Schulman). Their *gradients* differ (loss.kl_penalty): k1's has zero mean (no pull to
    the reference), k2's is the gradient of KL(pi || ref), the reverse KL GRPO states (default), k3's that of
    the forward KL(ref || pi) (DeepSeek's GRPO loss, Tunix's default)."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses become one number: over all tokens, per sequence then over sequences, or token
    sums divided by a constant (`norm_tokens`) per sequence (Dr. GRPO, no length bias)."""
    norm_tokens: int = Field(1024, ge=1)
    """The constant of seq-mean-token-sum-norm (usually the generation budget, max_tokens)."""
    correction: Literal["tis", "seq_tis", "mis", "icepop"] = "tis"
    """The importance correction against the engine, from rho = pi_learner / pi_engine per sampled token (detached;
    learner/loss.py `engine_is_weight` cites whose definition each follows): 'tis' weighs each token's policy loss by
    min(rho, is_cap); 'seq_tis' weighs every token of a sequence by min(product of its rhos, is_cap); 'mis' gives
    weight rho where rho <= is_cap and 0 above it, per sequence (product) or token (`mis_level`); 'icepop' gives
    weight rho to tokens with icepop_low <= rho <= icepop_high and masks the others out of the gradient.
    `learner/is_clip_frac` is the fraction of tokens truncated, `learner/is_masked_frac` of those given weight 0.
    On-policy (epochs 1, one mini-batch) the PPO ratio is exactly 1, so the clips bound nothing and this correction
    is the only bound on engine/learner drift."""
    is_cap: float | None = Field(2.0, gt=0)
    """The cap of tis, seq_tis and mis (the ratio above which a weight is truncated, or masked by mis); with tis,
    None = no correction (the mismatch is still reported)."""
    mis_level: Literal["sequence", "token"] = "sequence"
    """What mis masks: a whole sequence whose product of ratios exceeds is_cap, or each token whose ratio does."""
    icepop_low: float = Field(0.5, ge=0)
    """icepop: tokens with rho below this get weight 0 (IcePop's alpha, 0.5 in Ring-1T)."""
    icepop_high: float = Field(5.0, gt=0)
    """icepop: tokens with rho above this get weight 0 (IcePop's beta, 5 in Ring-1T)."""
    dual_clip: float | None = Field(None, gt=1)
    """Dual-clip PPO (Ye et al. 2020): for A < 0 the per-token loss is capped at -dual_clip * A (c > 1, e.g. 3),
    bounding what one token with a very large ratio can contribute; None = off. Like the ratio clips it only
    acts off-policy (epochs > 1 or several mini-batches)."""
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus: the loss subtracts entropy_coef x the entropy of each completion token's sampling
    distribution (temperature and truncation applied), aggregated as the policy term is (`loss_agg`), with its
    gradient: a push against a policy collapsing onto one answer; 0 = off (the entropy is still logged, detached).
    It spreads mass at every position, not only where the choice is: on the CPU demo 0.005 did not hold the entropy
    up and learned less (docs/demo.md, run E2)."""
    engine_logprobs: Literal["processed", "raw"] = "processed"
    """What the batch's engine logprobs are: 'processed' = after temperature and top-k/top-p/min-p (vLLM
    --logprobs-mode processed_logprobs; the sampling distribution), 'raw' = the untempered model distribution."""
    epochs: int = Field(1, ge=1)
    """Passes over each batch (GRPO's mu); > 1 costs one extra forward for the old logprobs."""
    mini_batch_size: int | None = Field(None, ge=1)
    """Sequences per optimizer update; None = the whole batch (one update per epoch)."""
    micro_batch_size: int = Field(8, ge=1)
    """Sequences per forward/backward (gradient accumulation within a mini-batch); bounds memory."""
    skip_zero_variance_groups: bool = False
    """Leave out of the update every group whose rewards are all equal (all solved or all failed): their
    advantages are 0 under every GRPO variant, so they add no policy gradient, only forward/backward time (DAPO's
    dynamic sampling, without its refill). The kept tokens then carry the whole loss normalisation, and with
    kl_beta > 0 the left-out samples' KL term is lost. When no group varies, the whole batch is used.
    `learner/zero_adv_frac` (the fraction of such groups) is logged either way."""

    @model_validator(mode="after")
    def _check(self) -> GrpoConfig:
        if self.correction in ("seq_tis", "mis") and self.is_cap is None:
            raise ValueError(f"correction {self.correction} truncates or masks at is_cap, which is null; set "
                             "learner.grpo.is_cap (e.g. 2.0)")
        if self.correction == "icepop" and self.icepop_low >= self.icepop_high:
            raise ValueError(f"icepop_low ({self.icepop_low}) must be below icepop_high ({self.icepop_high}): IcePop "
                             "keeps the tokens whose ratio lies between them; lower learner.grpo.icepop_low")
        return self

    @property
    def corrects_engine(self) -> bool:
        """Whether the loss weighs tokens by their engine/learner ratio (any correction but tis with no cap)."""
        return self.correction != "tis" or self.is_cap is not None


class LearnerConfig(Strict):
    devices: DevicesConfig = DevicesConfig()
    """Which slice of `jax.devices()` the learner owns."""
    mesh: MeshConfig = MeshConfig()
    """Mesh over that slice."""
    hosts: int = Field(1, ge=1)
    """Learner processes, one Ray actor per host of the learner's slice, joined by `jax.distributed` into one mesh
    (multi-controller SPMD); what Ray reserves for each is the driver's `learner.resources` (orchestration/config/schema.py).
    1 = a single process (no jax.distributed)."""
    topology: str = "cpu"
    """The chips the learner's JAX processes see, as a TPU topology name (e.g. "v5e:2x2": 4 v5e chips; "v5e:2x4":
    8 chips on 2 hosts), or "cpu". Only `orchestration.cli.preflight` reads it: it compiles the step for it."""
    lora: LoraConfig = LoraConfig()
    """The LoRA adapter: rank, alpha, target projections."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """AdamW on the LoRA weights."""
    grpo: GrpoConfig = GrpoConfig()
    """The GRPO loss, its batching and the importance correction."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the base weights and LoRA weights (float32 on CPU: bf16 is slow there and causes logit ties)."""
    seq_bucket: int = Field(64, ge=1)
    """Padded sequence lengths are multiples of this, so jit compiles once per bucket, not per batch."""
    pad_to_largest: bool = True
    """Pad each GRPO step to the largest shapes (length, completion window, shared-prompt block) an earlier step
    of this learner ran, never to smaller ones: a run compiles its step only when a batch outgrows them, not each
    time sampled lengths move between buckets (learner/batch.py ShapeFloor). The token losses of the training
    service (a client's forward_backward) keep a floor of their own. Off = each batch's own buckets."""
    logprob_chunk: int = Field(128, ge=0)
    """Most completion positions per chunk of the LM head + sampling transform + log-softmax: each chunk holds at
    most micro_batch_size x logprob_chunk x vocab fp32 logits; the window is split into even chunks (192 positions
    in 2 of 96, not 128 + a padded 128), and only completion positions are computed (penalties
    and min_tokens need > 0). 0 = the dense reference: full [micro_batch, L, vocab] fp32 logits, as before."""
    share_prompts: bool = True
    """Run each distinct prompt of a micro-batch through the decoder once, not once per sample
    (learner/shared_prompts.py): a group's samples share it. Equal to the plain forward up to float rounding;
    off = every row runs prompt + completion."""
    tenant_slots: int = Field(4, ge=1)
    """Adapters one pass of several tenants' datums stacks (learner/tenant_stack.py): its program is keyed by this,
    not by how many of them are filled, so a pass of fewer tenants compiles nothing new; more take more slots."""
    remat: bool = False
    """Recompute each decoder layer in the backward pass (less memory, ~30% more compute)."""
    cpu_cores: tuple[int, ...] | None = None
    """CPU only: the cores the learner's threads may run on (Linux CPU affinity of every thread of its actor's
    process, set before JAX starts its thread pools), e.g. [1] with the engine on [0] (rollout.backend.cpu_cores):
    each part keeps its own cores, as on a TPU host each keeps its own chips. None = any core."""
    compile_cache: bool = True
    """Keep compiled step pieces on disk (JAX's persistent compilation cache, $AHA_CACHE/jax_cache/learner, at
    most 2 GiB, least recently used first out): a resumed or repeated run skips recompiling its step, which takes
    minutes for a large model on TPU."""
    checkpoint_keep: int = Field(3, ge=1)
    """Keep the last N checkpoints."""
    seed: int = 0
    """Seeds LoRA initialisation and the learner's RNG (saved in checkpoints)."""
    engine_check: bool = True
    """Stop a run whose first-step `learner/logprob_abs_diff` (per token, learner vs engine, before any update)
    exceeds `max_engine_gap`, with an error naming the model family."""
    max_engine_gap: float | None = Field(None, gt=0)
    """The bound of that check; None = 1e-3 for float32, 5e-2 for bfloat16 (its rounding alone moves logprobs;
    that figure is a margin, not a measurement)."""

    @property
    def engine_gap_bound(self) -> float | None:
        if not self.engine_check:
            return None
        if self.max_engine_gap is not None:
            return self.max_engine_gap
        return 1e-3 if self.param_dtype == "float32" else 5e-2
