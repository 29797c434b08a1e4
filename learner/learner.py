"""Learner: owns the base model (Tunix NNX) on its mesh and the LoRA adapters on it, and updates them.

Its primitives are the Tinker API's: `forward_backward(batch, loss)` computes the loss's gradient and adds it to
the gradient held for that adapter, `optim_step()` applies that gradient with AdamW and clears it,
`lora_tensors()` gives the adapter the engines load next (save-for-sampler). A GRPO step is
forward_backward(batch, "grpo") + optim_step() on the learner's own adapter (`POLICY`); a training service adds an
adapter per client (learner/adapters.py) and trains it with the token losses (learner/token_losses.py) through the
same model, logprob and update code.

forward_backward(batch, "grpo"):
1. group-relative advantages from the rewards;
2. shuffle whole groups (with the learner's saved RNG) and pack into bucketed [rows, L] arrays; micro-batches run
   each distinct prompt once (learner/shared_prompts.py);
3. if more than one update per batch (epochs or mini-batches): one forward for the old logprobs, and every update
   but the last is applied here (each needs the one before it); the last one's gradient is left for optim_step;
4. metrics as token-weighted means over everything the step saw.
The adapter leaves as PEFT tensors (`lora_tensors`) or a PEFT folder (`export_lora`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from learner import train_step as ts
from learner.adapter_api import POLICY, AdamParams
from learner.adapters import Adapter, OpenUpdate, init_opt_state, new_adapter, split_lora
from learner.batch import PackedBatch, ShapeFloor, TrainBatch, pack, slice_rows
from learner.checkpoint import Checkpointer
from learner.compile_time import compile_seconds
from learner.config import LearnerConfig, LoraConfig
from learner.distributed import put_global, to_host, tree_to_host
from learner.lora import adapter_config, apply_lora, peft_tensors
from learner.loss import LossOptions, constant_reward_groups, grpo_advantages, token_weights
from learner.mesh import learner_mesh
from learner.model import load_model, read_hf_config
from learner.sampling import SamplingTransform
from learner.shared_prompts import Layout, SharedPrompts, layout, shared_prompts
from learner.token_batch import TokenBatch
from learner.token_step import token_forward_backward
from common.peft_adapter import write_adapter
from common.storage import write_folder

log = logging.getLogger(__name__)


class Learner:
    """LoRA updates by forward_backward + optim_step; see the module docstring."""

    def __init__(self, cfg: LearnerConfig, model_path: Path, checkpoint_dir: str | Path | None = None):
        self.cfg = cfg
        self.model_path = Path(model_path)
        self.mesh = learner_mesh(cfg.devices, cfg.mesh)
        self._hf = read_hf_config(self.model_path)
        with jax.set_mesh(self.mesh):
            model, self.family = load_model(self.model_path, self.mesh, cfg.param_dtype, cfg.remat)
            self._base_graph = nnx.split(model)  # every further adapter is a LoRA on this (learner/adapters.py)
            model = apply_lora(model, cfg.lora, cfg.seed)
        parts, params = split_lora(model, self._hf)
        tx = ts.make_optimizer(cfg.optimizer)
        self.adapters: dict[str, Adapter] = {
            POLICY: Adapter(cfg.lora, parts, params, init_opt_state(tx, params, self.mesh), tx, per_step_adam=False)}
        self._layout: Layout | None = None  # this step's prompt-sharing block sizes (None: plain rows)
        self._floor = ShapeFloor()  # the largest GRPO step shapes so far (learner.pad_to_largest)
        self._token_floor = ShapeFloor()  # the same for the token losses (the Tinker API's forward_backward)
        self._logits_fn = None
        self._rng = np.random.default_rng(cfg.seed)
        self._checkpointer = Checkpointer(checkpoint_dir, cfg.checkpoint_keep) if checkpoint_dir else None
        self._opts = LossOptions.of(cfg.grpo)
        batch_axis = "fsdp" if self.mesh.shape["fsdp"] > 1 else None
        self._data_parallel = self.mesh.shape["fsdp"]
        self._batch_sharding = NamedSharding(self.mesh, PartitionSpec(batch_axis))
        log.info("learner: %s on %s, mesh %s", self.family, [str(d) for d in self.mesh.devices.flat],
                 dict(self.mesh.shape))

    # The policy adapter's state, as GRPO, its checkpoints and tests read it.
    @property
    def params(self) -> dict:
        return self.adapters[POLICY].params

    @params.setter
    def params(self, value: dict) -> None:
        self.adapters[POLICY].params = value

    @property
    def opt_state(self) -> Any:
        return self.adapters[POLICY].opt_state

    @opt_state.setter
    def opt_state(self, value: Any) -> None:
        self.adapters[POLICY].opt_state = value

    @property
    def _parts(self) -> ts.ModelParts:
        return self.adapters[POLICY].parts

    # ---- the update primitives ----------------------------------------------------------------------------
    def forward_backward(self, batch: TrainBatch | TokenBatch, loss: str = "grpo", adapter: str = POLICY,
                         config: dict[str, float] | None = None, forward_only: bool = False) -> dict[str, Any]:
        """Add the gradient of `loss` on `batch` to `adapter`'s held gradient (none with `forward_only`).

        "grpo": the GRPO objective on a TrainBatch of groups, for the policy adapter (see the module docstring for
        what it does with several updates per batch); returns `learner/...` metrics. A token loss
        (learner/token_losses.py, `config` its settings) on a TokenBatch: returns {"loss": summed loss,
        "logprobs": each datum's target logprobs before the update}. The gradient waits for `optim_step`."""
        if loss != "grpo":
            if not isinstance(batch, TokenBatch):
                raise ValueError(f"loss {loss!r} reads a TokenBatch (per-token inputs), not a {type(batch).__name__}")
            out, self._layout = token_forward_backward(self.cfg, self._adapter(adapter), batch, loss, config,
                                                       forward_only, self._batch_sharding, self._share_layout,
                                                       self._token_floor)
            return out
        if adapter != POLICY or not isinstance(batch, TrainBatch) or forward_only:
            raise ValueError("loss 'grpo' trains the policy adapter on a TrainBatch of groups (with a gradient)")
        t0, compiled_before = time.perf_counter(), compile_seconds()
        g = self.cfg.grpo
        adv = grpo_advantages(batch.rewards, batch.group_ids, g.std_normalize)
        constant = constant_reward_groups(batch.rewards, batch.group_ids)
        groups = np.asarray(batch.group_ids)
        zero_adv_frac = len(np.unique(groups[constant])) / len(np.unique(groups))
        if g.skip_zero_variance_groups and constant.any() and not constant.all():
            batch, adv = _take(batch, adv, np.flatnonzero(~constant))
        micro, mini, rows = self._batch_geometry(len(batch))
        floor = self._floor if self.cfg.pad_to_largest else None
        packed = pack(*_take(batch, adv, self._group_order(batch.group_ids)), self.cfg.seq_bucket, rows, floor)
        self._layout = self._share_layout(packed, micro, floor)
        lay = self._layout
        self._floor.raise_to(packed, lay.prompts if lay else 0, lay.prompt_len if lay else 0)
        off_policy = g.epochs > 1 or rows // mini > 1
        logprob_fn, accumulate = self._compiled(batch.sampling, off_policy)

        old = self._old_logprobs(logprob_fn, packed, micro) if off_policy else None
        totals: dict[str, float] = {}
        losses, norms = [], []
        updates = [lo for _ in range(g.epochs) for lo in range(0, rows, mini)]
        for k, lo in enumerate(updates):
            losses.append(self._accumulate(accumulate, packed, old, slice(lo, lo + mini), micro, totals))
            if k < len(updates) - 1:
                norms.append(self._apply_grads())
        self.adapters[POLICY].open = OpenUpdate(t0, norms, len(updates), compiled_before)
        out = self._metrics(totals, losses, adv)
        out["learner/completion_tokens"] = float(packed.loss_mask.sum())
        out["learner/zero_adv_frac"] = zero_adv_frac
        out["learner/trained_samples"] = float(len(batch))
        return out

    def optim_step(self, adapter: str = POLICY, adam: AdamParams | None = None) -> dict[str, float]:
        """Apply `adapter`'s held gradient (AdamW on its LoRA weights) and clear it; returns `learner/grad_norm`,
        `learner/updates`, `learner/step_s` and `learner/compile_s` (both from the forward_backward that opened the
        update: its seconds, and those of them spent making XLA programs for new shapes). `adam`: the
        update's AdamW numbers for an adapter a service added; the policy's are the run config's."""
        a = self._adapter(adapter)
        if a.grads is None:
            raise ValueError(f"optim_step: adapter {adapter!r} holds no gradient; call forward_backward first")
        if a.per_step_adam:
            a.opt_state = ts.with_adam(a.opt_state, adam or AdamParams())
        elif adam is not None:
            raise ValueError("the policy adapter's AdamW numbers are the run config's learner.optimizer")
        opened, a.open = a.open or OpenUpdate(time.perf_counter(), [], 1, compile_seconds()), None
        norms = [*opened.norms, self._apply_grads(a)]
        return {"learner/grad_norm": float(np.mean(norms)), "learner/updates": float(opened.updates),
                "learner/step_s": time.perf_counter() - opened.t0,
                "learner/compile_s": compile_seconds() - opened.compiled_before}

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One GRPO step: forward_backward(batch, "grpo") + optim_step(); returns their `learner/...` metrics."""
        return {**self.forward_backward(batch, "grpo"), **self.optim_step()}

    def _group_order(self, group_ids: np.ndarray) -> np.ndarray:
        """Rows shuffled by whole groups (a group's samples adjacent, so micro-batches share their prompts)."""
        groups = np.asarray(group_ids)
        distinct = np.unique(groups)
        return np.concatenate([np.flatnonzero(groups == g) for g in distinct[self._rng.permutation(len(distinct))]])

    def _share_layout(self, packed: PackedBatch, micro: int, floor: ShapeFloor | None = None) -> Layout | None:
        if not self.cfg.share_prompts or self.cfg.logprob_chunk == 0:
            return None
        # Tunix's Gemma 3 masks its sliding window by slot index (see shared_prompts): share within one window.
        span = self._hf.get("sliding_window") if self.family == "gemma3" else None
        return layout(packed, micro, self._data_parallel, self.cfg.seq_bucket, span, floor)

    def _batch_geometry(self, n: int) -> tuple[int, int, int]:
        """(micro, mini, rows): micro divides mini divides rows >= n; micro divisible by the data-parallel size."""
        micro = math.ceil(min(self.cfg.grpo.micro_batch_size, n) / self._data_parallel) * self._data_parallel
        mini = math.ceil((self.cfg.grpo.mini_batch_size or n) / micro) * micro
        return micro, mini, math.ceil(n / mini) * mini

    def _compiled(self, sampling: SamplingTransform, off_policy: bool):
        key, fns = (sampling, off_policy), self.adapters[POLICY].fns
        if key not in fns:
            fns[key] = grpo_pieces(self.cfg, self._parts, sampling, off_policy)
        return fns[key]

    def _put(self, packed: PackedBatch, rows: slice, weights: np.ndarray) -> ts.MicroBatch:
        p = slice_rows(packed, rows)
        arrays = (p.tokens, p.targets, p.valid, p.loss_mask, p.engine_logprobs, p.advantages, weights, p.window)
        put = lambda a: put_global(a, self._batch_sharding)
        shared = None
        if self._layout is not None:
            shared = SharedPrompts(*map(put, shared_prompts(packed, rows, self._layout)))
        return ts.MicroBatch(*map(put, arrays), shared)

    def _old_logprobs(self, logprob_fn, packed: PackedBatch, micro: int) -> tuple[np.ndarray, np.ndarray]:
        """Pre-update logprobs (sampling transform, and the engine's convention) for every row."""
        logps, cmps = [], []
        zeros = np.zeros(packed.loss_mask.shape, np.float32)
        for lo in range(0, len(packed.tokens), micro):
            rows = slice(lo, lo + micro)
            logp, raw = logprob_fn(self.params, self._parts.base, self._put(packed, rows, zeros[rows]))
            logps.append(to_host(logp))
            cmps.append(to_host(raw if raw is not None else logp))
        return np.concatenate(logps), np.concatenate(cmps)

    def _accumulate(self, accumulate, packed, old, rows: slice, micro: int, totals: dict) -> float:
        """Add the gradient of one mini-batch (over its micro-batches) to the held gradient; returns its loss."""
        weights = token_weights(packed.loss_mask[rows], self.cfg.grpo.loss_agg, self.cfg.grpo.norm_tokens)
        policy = self.adapters[POLICY]
        acc = policy.grads if policy.grads is not None else jax.tree.map(jnp.zeros_like, self.params)
        loss = 0.0
        for lo in range(0, rows.stop - rows.start, micro):
            r = slice(rows.start + lo, rows.start + lo + micro)
            mb = self._put(packed, r, weights[lo : lo + micro])
            old_logp, old_cmp = (None, None) if old is None else (
                put_global(old[0][r], self._batch_sharding), put_global(old[1][r], self._batch_sharding))
            acc, mb_loss, sums = accumulate(self.params, self._parts.base, acc, mb, old_logp, old_cmp)
            loss += float(mb_loss)
            for k, v in sums.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        policy.grads = acc
        return loss

    def _apply_grads(self, a: Adapter | None = None) -> float:
        """One AdamW update of adapter `a` (the policy) with its held gradient, which is then cleared; returns the
        gradient's pre-clip norm."""
        a = a or self.adapters[POLICY]
        grads, a.grads = a.grads, None
        a.params, a.opt_state, norm = a.apply(a.params, a.opt_state, grads)
        return float(norm)

    def _adapter(self, name: str) -> Adapter:
        if name not in self.adapters:
            raise ValueError(f"no adapter {name!r} on this learner (it has {sorted(self.adapters)})")
        return self.adapters[name]

    @staticmethod
    def _metrics(totals: dict, losses: list, adv: np.ndarray) -> dict[str, float]:
        tokens = max(totals.pop("tokens"), 1.0)
        out = {f"learner/{k}": v / tokens for k, v in totals.items()}
        out["learner/clip_frac"] = out.pop("learner/clip")
        out["learner/dual_clip_frac"] = out.pop("learner/dual_clip")
        out["learner/is_ratio_mean"] = out.pop("learner/is_ratio")
        out["learner/is_clip_frac"] = out.pop("learner/is_clip")
        out["learner/is_masked_frac"] = out.pop("learner/is_masked", 0.0)  # only mis and icepop mask
        out.update({
            "learner/loss": float(np.mean(losses)),
            "learner/adv_std": float(np.std(adv)),
        })
        return out

    @property
    def base_state(self) -> nnx.State:
        """The frozen base weights (never updated; exposed so tests can check that)."""
        return self._parts.base

    def logits(self, tokens: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        """Policy logits [B, L, V] (LoRA applied) for right-padded tokens: for evaluation and reference checks."""
        tokens = np.asarray(tokens, np.int32)
        valid = np.ones(tokens.shape, bool) if valid is None else np.asarray(valid, bool)
        if self._logits_fn is None:
            self._logits_fn = jax.jit(lambda lora, base, t, v: ts.forward_logits(ts.merge(
                self._parts._replace(base=base), lora), t, v))
        return np.asarray(self._logits_fn(self.params, self._parts.base, tokens, valid))

    # ---- adapter out ---------------------------------------------------------------------------------------
    def lora_tensors(self, adapter: str = POLICY) -> tuple[dict[str, np.ndarray], dict]:
        """An adapter's LoRA weights as numpy arrays with PEFT names ([r, in] / [out, r]) and its adapter_config."""
        a = self._adapter(adapter)
        # The weights are sharded over the mesh, which may span processes: gathering them is then a collective.
        tensors = peft_tensors(tree_to_host(a.params), a.lora.rank)
        return tensors, adapter_config(a.lora, str(self.model_path))

    def export_lora(self, out_dir: str | Path, adapter: str = POLICY) -> str:
        """PEFT adapter folder (adapter_config.json + adapter_model.safetensors) that vLLM and peft load; `out_dir`
        may be a storage URI (gs://...), where every host can read it."""
        tensors, config = self.lora_tensors(adapter)
        return write_folder(out_dir, lambda local: write_adapter(local, tensors, config))

    # ---- the adapters a service adds ------------------------------------------------------------------------
    def add_adapter(self, name: str, lora: LoraConfig, seed: int = 0) -> None:
        """A new LoRA on the base (B = 0: it starts as the base model), trained with per-step AdamW."""
        if name in self.adapters:
            raise ValueError(f"adapter {name!r} exists already")
        self.adapters[name] = new_adapter(self._base_graph, self._parts, lora, seed, self.mesh)
        log.info("adapter %s: rank %d alpha %g (%d adapters)", name, lora.rank, lora.alpha, len(self.adapters))

    def drop_adapter(self, name: str) -> None:
        """Forget an adapter (its weights and optimizer state); the policy stays."""
        if name == POLICY:
            raise ValueError("the policy adapter cannot be dropped")
        self.adapters.pop(name, None)

    def save_adapter(self, name: str, directory: str) -> None:
        """An adapter's LoRA weights, optimizer state and LoRA config as one Orbax checkpoint in `directory` (a
        local path or a storage URI); a resume from it is exact."""
        a = self._adapter(name)
        with Checkpointer(directory, keep=1) as store:
            store.save(0, a.params, a.opt_state, {"lora": a.lora.model_dump(mode="json")})

    def load_adapter(self, name: str, directory: str, optimizer: bool = True) -> LoraConfig:
        """Adapter `name` from a `save_adapter` checkpoint (made with its LoRA config when it does not exist yet);
        `optimizer`: restore the Adam moments too, else keep them fresh. Returns its LoRA config."""
        with Checkpointer(directory, keep=1) as store:
            if store.latest_step() is None:
                raise ValueError(f"no adapter checkpoint at {directory}")
            lora = LoraConfig.model_validate(store.meta(0)["lora"])
            if name not in self.adapters:
                self.add_adapter(name, lora)
            a = self.adapters[name]
            params, opt_state, _ = store.restore(0, _abstract(a.params), _abstract(a.opt_state),
                                                 a.lora.model_dump(mode="json"))
        a.params, a.grads, a.open = params, None, None
        if optimizer:
            a.opt_state = opt_state
        return lora

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def save(self, step: int, extra: dict | None = None) -> None:
        """Checkpoint LoRA params, optimizer state, `step`, RNG and `extra` (JSON-able, e.g. the data stream)."""
        if self._checkpointer is None:
            raise ValueError("Learner.save needs a checkpoint_dir: pass checkpoint_dir= to Learner(...)")
        # The shape floor too: a resumed step then pads (and rounds) as the uninterrupted run's step would.
        meta = {"step": step, "rng": self._rng.bit_generator.state, "extra": extra or {},
                "lora": self.cfg.lora.model_dump(mode="json"), "shape_floor": dataclasses.asdict(self._floor)}
        self._checkpointer.save(step, self.params, self.opt_state, meta)

    def restore(self) -> tuple[int, dict]:
        """Restore the latest complete checkpoint; (step, extra), or (0, {}) when there is none."""
        if self._checkpointer is None or self._checkpointer.latest_step() is None:
            return 0, {}
        step = self._checkpointer.latest_step()
        lora_cfg = self.cfg.lora.model_dump(mode="json")
        params, opt_state, meta = self._checkpointer.restore(step, _abstract(self.params), _abstract(self.opt_state),
                                                             lora_cfg)
        self.params, self.opt_state = params, opt_state
        self._rng.bit_generator.state = meta["rng"]
        self._floor = ShapeFloor(**meta.get("shape_floor", {}))  # checkpoints from before it: none
        log.info("restored checkpoint step %d from %s", step, self._checkpointer.directory)
        return int(meta["step"]), meta["extra"]

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()


def grpo_pieces(cfg: LearnerConfig, parts: ts.ModelParts, sampling: SamplingTransform, off_policy: bool):
    """The jitted pieces of a GRPO update (logprobs, gradient accumulation) for `parts`: what the learner runs and
    preflight compiles for hardware it does not have (learner/aot.py)."""
    raw, chunk = cfg.grpo.engine_logprobs == "raw", cfg.logprob_chunk
    return (ts.make_logprob_fn(parts, sampling, raw, chunk),
            ts.make_accumulate_fn(parts, sampling, LossOptions.of(cfg.grpo), raw, off_policy, chunk))


def _abstract(tree: Any) -> Any:
    """A restore target: each leaf's shape, dtype and sharding."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _take(batch: TrainBatch, adv: np.ndarray, order: np.ndarray) -> tuple[TrainBatch, np.ndarray]:
    """The batch's samples (and their advantages) in `order`."""
    pick = lambda xs: [xs[i] for i in order]
    b = TrainBatch(pick(batch.prompt_ids), pick(batch.completion_ids), pick(batch.engine_logprobs),
                   np.asarray(batch.rewards)[order], np.asarray(batch.group_ids)[order],
                   batch.sampling, None if batch.completion_mask is None else pick(batch.completion_mask))
    return b, adv[order]
