"""Learner: owns the base model (Tunix NNX) on its mesh and the LoRA adapters on it, and updates them.

Its primitives are the Tinker API's: `forward_backward(batch, loss)` computes the loss's gradient and adds it to
the gradient held for that adapter, `forward` computes the same without one, `optim_step()` applies the held
gradient with AdamW and clears it, `save_for_sampler()` gives the adapter the engines load next, `save_state` /
`load_state` keep an adapter with its optimizer state. A training service adds an adapter per client
(learner/adapters.py) and trains it with the token losses (learner/token_losses.py); the GRPO loop trains the
learner's own adapter (`POLICY`) with the "grpo" loss, through the same model, logprob and update code.

forward_backward(batch, "grpo") on a TrainBatch whose samples carry their advantages (the loop computed them, and
splits a step into mini-batches and epochs of forward_backward + optim_step calls: orchestration/update.py):
1. shuffle whole groups (with the learner's saved RNG) and pack into bucketed [rows, L] arrays; micro-batches run
   each distinct prompt once (learner/shared_prompts.py);
2. add each micro-batch's gradient to the held one; with `old` (a step of several updates: the logprobs `forward`
   gave before its first) the PPO ratio is taken against those, else it is 1 (on-policy);
3. metrics as token-weighted means over the batch.
Nothing is applied before `optim_step`. The adapter leaves as a `LoraAdapter` (`save_for_sampler`: PEFT tensors under
the name the engines serve it by) or a PEFT folder (`export`).
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
from learner.batch import OldLogprobs, PackedBatch, ShapeFloor, TrainBatch, completion_values, pack, slice_rows
from learner.checkpoint import Checkpointer
from learner.compile_time import compile_seconds
from learner.config import LearnerConfig, LoraConfig
from learner.distributed import put_global, to_host, tree_to_host
from learner.lora import adapter_config, apply_lora, peft_tensors
from learner.loss import LossOptions, token_weights
from learner.mesh import learner_mesh
from learner.model import load_model, read_hf_config
from learner.sampling import SamplingTransform
from learner.shared_prompts import Layout, layout, put_shared, shared_prompts
from learner.token_batch import TokenBatch
from learner.tenant_stack import pass_rank, stack, stackable, stacked_parts
from learner.token_step import tenant_forward_backward, token_forward_backward
from common.lora_adapter import LoraAdapter
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
        self._stacks: dict[tuple, tuple] = {}  # (rank, targets) -> the stacked graph of tenant passes, its programs
        self._logits_fn = None
        self._rng = np.random.default_rng(cfg.seed)
        self._checkpointer = Checkpointer(checkpoint_dir, cfg.checkpoint_keep) if checkpoint_dir else None
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
                         config: dict[str, float] | None = None, old: dict | None = None) -> dict[str, Any]:
        """Add the gradient of `loss` on `batch` to `adapter`'s held gradient; `optim_step` applies it.

        "grpo": the clipped GRPO objective (learner/loss.py) on a TrainBatch whose samples carry their advantages,
        for the policy adapter; `old`: what `forward(batch, "grpo")` gave before the step's first update (a step of
        several updates takes its PPO ratio against it), None on-policy. Returns `learner/...` metrics (per-token
        means over this batch, and its token count). A token loss (learner/token_losses.py, `config` its settings)
        on a TokenBatch: returns {"loss": summed loss, "logprobs": each datum's target logprobs before the update}."""
        if loss != "grpo":
            return self._token(batch, loss, adapter, config, forward_only=False)
        self._check_grpo(batch, adapter)
        t0, compiled_before = time.perf_counter(), compile_seconds()
        order = self._group_order(batch.group_ids)
        old_logprobs = None if old is None else OldLogprobs(old["logprobs"], old["compared"]).take(order)
        micro, rows = self._batch_geometry(len(batch))
        packed = self._pack(batch.take(order), micro, rows, old_logprobs)
        _, accumulate = self._compiled(batch.sampling, off_policy=old is not None)
        totals: dict[str, float] = {}
        loss_value = self._accumulate(accumulate, packed, micro, totals)
        policy = self.adapters[POLICY]
        policy.open = policy.open or OpenUpdate(t0, compiled_before)
        out = self._metrics(totals, loss_value)
        out["learner/completion_tokens"] = float(packed.loss_mask.sum())
        out["learner/trained_samples"] = float(len(batch))
        return out

    def forward(self, batch: TrainBatch | TokenBatch, loss: str = "grpo", adapter: str = POLICY,
                config: dict[str, float] | None = None) -> dict[str, Any]:
        """forward_backward without the gradient. "grpo": {"logprobs", "compared"}: per sample, its completion
        tokens' logprobs under the sampling transform and in the engine's convention (what forward_backward's `old`
        takes); a token loss: {"loss", "logprobs"}."""
        if loss != "grpo":
            return self._token(batch, loss, adapter, config, forward_only=True)
        self._check_grpo(batch, adapter)
        micro, rows = self._batch_geometry(len(batch))
        packed = self._pack(batch, micro, rows)
        logprob_fn, _ = self._compiled(batch.sampling, off_policy=True)
        logp, compared = self._old_logprobs(logprob_fn, packed, micro)
        return {"logprobs": completion_values(packed, logp, batch),
                "compared": completion_values(packed, compared, batch)}

    def optim_step(self, adapter: str = POLICY, adam: AdamParams | None = None) -> dict[str, float]:
        """Apply `adapter`'s held gradient (AdamW on its LoRA weights) and clear it; returns `learner/grad_norm`,
        `learner/step_s` and `learner/compile_s` (both from the first forward_backward of the update: its seconds,
        and those of them spent making XLA programs for new shapes). `adam`: the update's AdamW numbers for an
        adapter a service added; the policy's are the run config's."""
        a = self._adapter(adapter)
        if a.grads is None:
            raise ValueError(f"optim_step: adapter {adapter!r} holds no gradient; call forward_backward first")
        if a.per_step_adam:
            a.opt_state = ts.with_adam(a.opt_state, adam or AdamParams())
        elif adam is not None:
            raise ValueError("the policy adapter's AdamW numbers are the run config's learner.optimizer")
        opened, a.open = a.open or OpenUpdate(time.perf_counter(), compile_seconds()), None
        norm = self._apply_grads(a)
        return {"learner/grad_norm": norm, "learner/step_s": time.perf_counter() - opened.t0,
                "learner/compile_s": compile_seconds() - opened.compiled_before}

    def _token(self, batch: Any, loss: str, adapter: str, config: dict[str, float] | None,
               forward_only: bool) -> dict[str, Any]:
        if not isinstance(batch, TokenBatch):
            raise ValueError(f"loss {loss!r} reads a TokenBatch (per-token inputs), not a {type(batch).__name__}")
        if batch.adapters:
            return self._tenants(batch, loss, config, forward_only)
        out, self._layout = token_forward_backward(self.cfg, self._adapter(adapter), batch, loss, config,
                                                   forward_only, self._batch_sharding, self._share_layout,
                                                   self._token_floor)
        return out

    def _tenants(self, batch: TokenBatch, loss: str, config: dict[str, float] | None,
                 forward_only: bool) -> dict[str, Any]:
        """A pass over several adapters' datums (`batch.adapters`), each row through its own adapter: {"loss": the
        summed loss, "adapter_loss": per adapter the sum of its datums', "logprobs": per datum}. A lone adapter, or
        adapters with LoRA leaves the per-row update does not know (learner/tenant_stack.py RANK_AXIS), run one pass
        each."""
        names = tuple(dict.fromkeys(batch.adapters))
        adapters = [self._adapter(n) for n in names]
        if len(names) == 1 or not all(stackable(a) for a in adapters):
            return self._tenants_apart(batch, names, loss, config, forward_only)
        rank = pass_rank([a.lora for a in adapters])
        targets = tuple(sorted(set().union(*(a.lora.target_modules for a in adapters))))
        slots = 1 << (max(self.cfg.tenant_slots, len(names)) - 1).bit_length()
        if (rank, targets) not in self._stacks:
            self._stacks[rank, targets] = (stacked_parts(self._base_graph, self._parts, rank, targets, self.mesh), {})
        parts, fns = self._stacks[rank, targets]
        stacked = stack(names, adapters, parts, slots)
        out = tenant_forward_backward(self.cfg, adapters, stacked, fns, batch, loss, config, forward_only,
                                      self._batch_sharding, self._share_layout, self._token_floor)
        self._layout = out["layout"]
        per_adapter = dict.fromkeys(names, 0.0)
        for name, value in zip(batch.adapters, out["loss"]):
            per_adapter[name] += value
        log.info("pass of %d adapters (%s), rank %d in %d slots, %d datums%s", len(names), ", ".join(names), rank,
                 slots, len(batch), f", compiled {out['compile_s']:.1f} s" if out["compile_s"] > 0.5 else "")
        return {"loss": float(sum(out["loss"])), "adapter_loss": per_adapter, "logprobs": out["logprobs"],
                "compile_s": out["compile_s"]}

    def _tenants_apart(self, batch: TokenBatch, names: tuple[str, ...], loss: str, config: dict[str, float] | None,
                       forward_only: bool) -> dict[str, Any]:
        per_adapter: dict[str, float] = {}
        logprobs: list[np.ndarray] = [np.zeros(0, np.float32)] * len(batch)
        for name in names:
            rows = [i for i, a in enumerate(batch.adapters) if a == name]
            part = TokenBatch([batch.tokens[i] for i in rows], [batch.targets[i] for i in rows],
                              [batch.inputs[i] for i in rows] if batch.inputs else [])
            out = self._token(part, loss, name, config, forward_only)
            for i, logp in zip(rows, out["logprobs"]):
                logprobs[i] = logp
            per_adapter[name] = out["loss"]
        return {"loss": float(sum(per_adapter.values())), "adapter_loss": per_adapter, "logprobs": logprobs}

    @staticmethod
    def _check_grpo(batch: Any, adapter: str) -> None:
        if adapter != POLICY or not isinstance(batch, TrainBatch):
            raise ValueError("loss 'grpo' trains the policy adapter on a TrainBatch of samples with advantages")

    def _pack(self, batch: TrainBatch, micro: int, rows: int, old: OldLogprobs | None = None) -> PackedBatch:
        """The batch packed (padded up to the largest shapes so far with learner.pad_to_largest) and its
        prompt-sharing layout set for `_put`."""
        floor = self._floor if self.cfg.pad_to_largest else None
        packed = pack(batch, self.cfg.seq_bucket, rows, floor, old)
        self._layout = lay = self._share_layout(packed, micro, floor)
        self._floor.raise_to(packed, lay.prompts if lay else 0, lay.prompt_len if lay else 0)
        return packed

    def _group_order(self, group_ids: np.ndarray) -> np.ndarray:
        """Rows shuffled by whole groups (a group's samples adjacent, so micro-batches share their prompts)."""
        groups = np.asarray(group_ids)
        distinct = np.unique(groups)
        return np.concatenate([np.flatnonzero(groups == g) for g in distinct[self._rng.permutation(len(distinct))]])

    def _share_layout(self, packed: PackedBatch, micro: int, floor: ShapeFloor | None = None,
                      tags: np.ndarray | None = None) -> Layout | None:
        if not self.cfg.share_prompts or self.cfg.logprob_chunk == 0:
            return None
        # Tunix's Gemma 3 masks its sliding window by slot index (see shared_prompts): share within one window.
        span = self._hf.get("sliding_window") if self.family == "gemma3" else None
        return layout(packed, micro, self._data_parallel, self.cfg.seq_bucket, span, floor, tags)

    def _batch_geometry(self, n: int) -> tuple[int, int]:
        """(micro, rows): micro divides rows >= n; micro divisible by the data-parallel size."""
        micro = math.ceil(min(self.cfg.grpo.micro_batch_size, n) / self._data_parallel) * self._data_parallel
        return micro, math.ceil(n / micro) * micro

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
            shared = put_shared(shared_prompts(packed, rows, self._layout), put)
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

    def _accumulate(self, accumulate, packed: PackedBatch, micro: int, totals: dict) -> float:
        """Add the batch's gradient (over its micro-batches) to the held gradient; returns its loss."""
        weights = token_weights(packed.loss_mask, self.cfg.grpo.loss_agg, self.cfg.grpo.norm_tokens)
        policy = self.adapters[POLICY]
        acc = policy.grads if policy.grads is not None else jax.tree.map(jnp.zeros_like, self.params)
        put = lambda a: put_global(a, self._batch_sharding)  # noqa: E731
        loss = 0.0
        for lo in range(0, len(packed.tokens), micro):
            r = slice(lo, lo + micro)
            mb = self._put(packed, r, weights[r])
            old_logp, old_cmp = (None, None) if packed.old_logprobs is None else (
                put(packed.old_logprobs[r]), put(packed.old_compared[r]))
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
    def _metrics(totals: dict, loss: float) -> dict[str, float]:
        tokens = max(totals.pop("tokens"), 1.0)
        out = {f"learner/{k}": v / tokens for k, v in totals.items()}
        out["learner/clip_frac"] = out.pop("learner/clip")
        out["learner/dual_clip_frac"] = out.pop("learner/dual_clip")
        out["learner/is_ratio_mean"] = out.pop("learner/is_ratio")
        out["learner/is_clip_frac"] = out.pop("learner/is_clip")
        out["learner/is_masked_frac"] = out.pop("learner/is_masked", 0.0)  # only mis and icepop mask
        out["learner/loss"] = loss
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
    def save_for_sampler(self, adapter: str = POLICY, name: str | None = None) -> LoraAdapter:
        """An adapter's LoRA weights (numpy, PEFT names, [r, in] / [out, r]) and adapter_config, to be served as
        `name` (default: the adapter's own name)."""
        a = self._adapter(adapter)
        # The weights are sharded over the mesh, which may span processes: gathering them is then a collective.
        tensors = peft_tensors(tree_to_host(a.params), a.lora.rank)
        return LoraAdapter(name or adapter, tensors, adapter_config(a.lora, str(self.model_path)))

    def export(self, out_dir: str | Path, adapter: str = POLICY) -> str:
        """PEFT adapter folder (adapter_config.json + adapter_model.safetensors) that vLLM and peft load; `out_dir`
        may be a storage URI (gs://...), where every host can read it."""
        lora = self.save_for_sampler(adapter)
        return write_folder(out_dir, lora.write)

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

    def save_state(self, name: str, directory: str) -> None:
        """An adapter's LoRA weights, optimizer state and LoRA config as one Orbax checkpoint in `directory` (a
        local path or a storage URI); a resume from it is exact."""
        a = self._adapter(name)
        with Checkpointer(directory, keep=1) as store:
            store.save(0, a.params, a.opt_state, {"lora": a.lora.model_dump(mode="json")})

    def load_state(self, name: str, directory: str, optimizer: bool = True) -> LoraConfig:
        """Adapter `name` from a `save_state` checkpoint (made with its LoRA config when it does not exist yet);
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
