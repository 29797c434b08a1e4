"""Ahead-of-time compile of the learner's step for hardware we do not have: abstract weights, real shardings.

What the Learner builds from real weights, built here from config.json alone (nothing is allocated):
- the Tunix model under `nnx.eval_shape`, its shardings from Tunix's rules on the learner's mesh (as Tunix's
  safetensors loader does), every weight cast to `param_dtype` (as the loader does);
- Qwix LoRA applied to that abstract model (as `learner.lora.apply_lora` does to the loaded one);
- the optimizer state's shapes and shardings from compiling `tx.init`, as the Learner runs it.
The jitted step pieces are the Learner's own (`learner.learner.grpo_pieces`, `train_step.make_apply_fn`), lowered with
`jax.ShapeDtypeStruct` inputs and compiled for the mesh's devices: CPU devices, or a TPU topology description
(`jax.experimental.topologies`, needs libtpu importable). XLA's memory and cost analyses come back per device.
This is MaxText's train_compile technique.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from learner import train_step as ts
from learner.batch import bucket_length
from learner.compiled_figures import FigureStore
from learner.config import LearnerConfig
from learner.learner import Learner, grpo_pieces
from learner.lora import apply_lora
from learner.sampling import SamplingTransform
from learner.model import DTYPES, family_of, fix_rope_theta, tunix_config

MODEL_CLASSES = {"llama3": ("tunix.models.llama3.model", "Llama3"), "qwen2": ("tunix.models.qwen2.model", "Qwen2"),
                 "qwen3": ("tunix.models.qwen3.model", "Qwen3"), "gemma3": ("tunix.models.gemma3.model", "Gemma3")}


def topology_devices(topology: str | None) -> list:
    """The devices to compile for: this host's CPUs for None/"cpu", else a TPU topology's (e.g. "v5e:2x2")."""
    if topology in (None, "cpu"):
        return jax.devices("cpu")
    from jax.experimental import topologies

    return list(topologies.get_topology_desc(topology_name=topology, platform="tpu").devices)


def _sds(x, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def abstract_model(hf: dict[str, Any], cfg: LearnerConfig, mesh: Mesh) -> tuple[ts.ModelParts, dict, str]:
    """(ModelParts with an abstract base, abstract LoRA params dict, family) as `Learner.__init__` makes them."""
    family = family_of(hf)
    module, name = MODEL_CLASSES[family]
    model_cls = getattr(importlib.import_module(module), name)
    tcfg = tunix_config(hf, cfg.param_dtype, cfg.remat)
    dtype = DTYPES[cfg.param_dtype]
    with jax.set_mesh(mesh):
        # Tunix's loader: eval_shape the model, shard by its rules, cast every tensor to the load dtype.
        graphdef, state = nnx.split(nnx.eval_shape(lambda: model_cls(tcfg, rngs=nnx.Rngs(params=0))))
        shardings = nnx.get_named_sharding(state, mesh)
        state = jax.tree.map(lambda x, s: _sds(jax.ShapeDtypeStruct(x.shape, dtype), s), state, shardings)

        def with_lora(st):
            model = nnx.merge(graphdef, st)
            fix_rope_theta(model, family)
            return apply_lora(model, cfg.lora, cfg.seed)

        model = nnx.eval_shape(with_lora, state)
    graphdef, lora_state, base = nnx.split(model, nnx.LoRAParam, ...)
    # Qwix gives LoRA A/B the sharding of the weight they adapt (transposed); the metadata carries it.
    lora_shardings = nnx.get_named_sharding(lora_state, mesh)
    base_shardings = nnx.get_named_sharding(base, mesh)
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), lora_state)
    base = jax.tree.map(_sds, base, base_shardings)
    lora = jax.tree.map(_sds, lora_state, lora_shardings).to_pure_dict()
    return ts.ModelParts(graphdef, template, base), lora, family


@dataclass(frozen=True)
class Geometry:
    """The shapes one GRPO step runs with (what the loop's update plan and the Learner's packing derive from the batch
    size)."""

    rows: int  # sequences per step, padded to whole mini-batches
    micro: int  # sequences per forward/backward
    mini: int  # sequences per optimizer update
    length: int  # padded tokens per sequence
    window: int  # padded completion positions per sequence (where the LM head runs)
    epochs: int

    @property
    def off_policy(self) -> bool:
        return self.epochs > 1 or self.rows // self.mini > 1

    @property
    def micro_steps(self) -> int:
        return self.epochs * self.rows // self.micro

    @property
    def updates(self) -> int:
        return self.epochs * self.rows // self.mini


def geometry(cfg: LearnerConfig, batch_size: int, max_sequence: int, max_completion: int,
             data_parallel: int) -> Geometry:
    """Step shapes for `batch_size` sequences of at most `max_sequence` tokens (`max_completion` of them generated),
    via the Learner's own rules (batch.pack buckets the completion window like the sequence)."""
    learner = SimpleNamespace(cfg=cfg, _data_parallel=data_parallel)
    # The loop sends one forward_backward per mini-batch of grpo.mini_batch_size samples (orchestration/update.py);
    # each is packed into `mini` rows of `micro`-row micro-batches.
    mini_size = min(cfg.grpo.mini_batch_size or batch_size, batch_size)
    micro, mini = Learner._batch_geometry(learner, mini_size)
    rows = -(-batch_size // mini_size) * mini
    length = bucket_length(max_sequence, cfg.seq_bucket)
    window = min(bucket_length(max_completion, cfg.seq_bucket), length)
    return Geometry(rows, micro, mini, length, window, cfg.grpo.epochs)


def abstract_micro_batch(mesh: Mesh, micro: int, length: int, window: int) -> ts.MicroBatch:
    """A micro-batch's arrays as `Learner._put` places them (rows over 'fsdp' when it has more than one device)."""
    batch = NamedSharding(mesh, PartitionSpec("fsdp" if mesh.shape["fsdp"] > 1 else None))
    bl = lambda dtype: jax.ShapeDtypeStruct((micro, length), dtype, sharding=batch)
    return ts.MicroBatch(bl(jnp.int32), bl(jnp.int32), bl(jnp.bool_), bl(jnp.float32), bl(jnp.float32),
                         jax.ShapeDtypeStruct((micro,), jnp.float32, sharding=batch), bl(jnp.float32),
                         jax.ShapeDtypeStruct((micro, window), jnp.int32, sharding=batch))


def abstract_opt_state(tx, lora: dict, mesh: Mesh):
    """Optimizer state as the Learner makes it: `jit(tx.init)(params)`, stray scalars pinned replicated."""
    init = jax.jit(tx.init).lower(lora).compile()
    replicated = NamedSharding(mesh, PartitionSpec())
    mesh_devices = set(mesh.devices.flat)
    fix = lambda s: s if isinstance(s, NamedSharding) and s.device_set == mesh_devices else replicated
    return jax.tree.map(lambda x, s: _sds(x, fix(s)), jax.eval_shape(tx.init, lora), init.output_shardings)


def compile_step(cfg: LearnerConfig, parts: ts.ModelParts, lora: dict, mesh: Mesh, geo: Geometry,
                 sampling: SamplingTransform, store: FigureStore | None = None,
                 label: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """Compile the Learner's jitted pieces a step runs (logprobs only off-policy); returns ({name: Figures}, abstract
    state by kind). A piece whose program `store` holds is not compiled again: its analyses are read from there
    (learner/compiled_figures.py; None: compile every piece). `label` names the step in the store's entries."""
    devices = list(mesh.devices.flat)
    store = store or FigureStore(shipped=None)
    figures = lambda lowered, piece: store.figures(lowered, devices, f"{label} {piece}".strip())
    logprob_fn, accumulate = grpo_pieces(cfg, parts, sampling, geo.off_policy)
    tx = ts.make_optimizer(cfg.optimizer)
    opt_state = abstract_opt_state(tx, lora, mesh)
    mb = abstract_micro_batch(mesh, geo.micro, geo.length, geo.window)
    old = (mb.loss_mask, mb.loss_mask) if geo.off_policy else (None, None)
    with jax.set_mesh(mesh):
        # The separate logprobs pass runs only off-policy (old logprobs before several updates): on-policy a step
        # never calls it, so its compile (a fifth of preflight's time: Qwen2.5-1.5B v5e:2x2 `--probe-layers` 196
        # -> 155 s without it) would measure nothing the step needs.
        compiled = {"logprobs": figures(logprob_fn.lower(lora, parts.base, mb), "logprobs")} if geo.off_policy else {}
        compiled["accumulate"] = figures(accumulate.lower(lora, parts.base, lora, mb, *old), "accumulate")
        compiled["apply"] = figures(ts.make_apply_fn(tx).lower(lora, opt_state, lora), "apply")
    state = {"frozen": parts.base, "lora": lora, "opt_state": opt_state, "grad_acc": lora}
    return compiled, state


def bytes_per_device(tree) -> int:
    """Bytes of the largest per-device shard set of a tree of sharded ShapeDtypeStructs."""
    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shard) * np.dtype(x.dtype).itemsize
    return total


@dataclass(frozen=True)
class Piece:
    """One compiled step piece, per device: XLA's memory and cost analyses and how often a step runs it."""

    name: str
    calls: int  # per GRPO step
    live_bytes: int  # arguments + outputs - aliased + temporaries + code, plus resident state it does not take
    temp_bytes: int
    flops: float
    bytes_accessed: float
    optimal_seconds: float  # XLA's TPU cost model; 0 when the backend gives none (CPU)


def analyse(compiled: dict[str, Any], state: dict[str, Any], geo: Geometry) -> list[Piece]:
    """Per-device figures of each compiled piece; `live_bytes` adds the resident state the piece leaves alone."""
    sizes = {k: bytes_per_device(v) for k, v in state.items()}
    # Between pieces the Learner keeps frozen + LoRA + Adam; the gradient accumulator lives during a mini-batch.
    absent = {"logprobs": sizes["opt_state"], "accumulate": sizes["opt_state"], "apply": sizes["frozen"]}
    calls = {"logprobs": geo.rows // geo.micro, "accumulate": geo.micro_steps,  # logprobs: compiled off-policy only
             "apply": geo.updates}
    pieces = []
    for name, c in compiled.items():
        m = c.memory_analysis()
        cost = c.cost_analysis() or {}
        live = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
                + m.generated_code_size_in_bytes + absent[name])
        pieces.append(Piece(name, calls[name], live, m.temp_size_in_bytes, float(cost.get("flops", 0.0)),
                            float(cost.get("bytes accessed", 0.0)), float(cost.get("optimal_seconds", 0.0))))
    return pieces
