"""Several LoRAs on one base model: each adapter's weights, optimizer, held gradient and compiled pieces.

The base weights are loaded once; every adapter is Qwix's LoRA applied to the same base graph (its own rank,
alpha, targets and seed), so a second adapter costs its LoRA weights and Adam moments, not another model. The
learner's own adapter (`POLICY`) is the one GRPO trains, with the run's optimizer config; a training service adds
one per client, each updated only by that client's forward_backward / optim_step (its AdamW numbers arrive with
every optim_step, as the Tinker API sends them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from learner import train_step as ts
from learner.config import LoraConfig
from learner.lora import apply_lora

@dataclass
class OpenUpdate:
    """An update forward_backward opened and optim_step closes: when it began, and the process's compile seconds
    then (learner/compile_time.py)."""

    t0: float
    compiled_before: float = 0.0


@dataclass
class Adapter:
    """One LoRA on the shared base."""

    lora: LoraConfig
    parts: ts.ModelParts  # its graph and LoRA shapes, and the shared base state
    params: dict
    opt_state: Any
    tx: optax.GradientTransformation
    per_step_adam: bool  # True: its AdamW numbers come with each optim_step (make_adam_optimizer)
    apply: Any = None  # jitted (params, opt_state, grads) -> (params, opt_state, norm)
    fns: dict[tuple, Any] = field(default_factory=dict)  # compiled pieces, per loss and its static settings
    grads: dict | None = None  # added by forward_backward, applied and cleared by optim_step
    open: OpenUpdate | None = None

    def __post_init__(self) -> None:
        if self.apply is None:
            self.apply = ts.make_apply_fn(self.tx, self.params, self.opt_state)


def init_opt_state(tx: optax.GradientTransformation, params: dict, mesh: jax.sharding.Mesh) -> Any:
    """tx's state for `params`, every leaf a NamedSharding on the learner's mesh: scalars such as Adam's step count
    would otherwise land on device 0, outside a learner that owns other devices, and a one-device learner's
    leaves came out as SingleDeviceSharding, which the update's jit keys apart from what it returns (the
    second step traced it again)."""
    replicated = NamedSharding(mesh, PartitionSpec())
    mesh_devices = set(mesh.devices.flat)
    on_mesh = lambda x: isinstance(x.sharding, NamedSharding) and x.sharding.device_set == mesh_devices  # noqa: E731
    return jax.tree.map(lambda x: x if on_mesh(x) else jax.device_put(x, replicated), jax.jit(tx.init)(params))


def split_lora(model: nnx.Module, hf: dict) -> tuple[ts.ModelParts, dict]:
    """(ModelParts, LoRA params as a plain dict) of a model with LoRA applied."""
    graphdef, lora_state, base = nnx.split(model, nnx.LoRAParam, ...)
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), lora_state)
    return ts.ModelParts(graphdef, template, base, hf), lora_state.to_pure_dict()


def new_adapter(base_graph: tuple, shared: ts.ModelParts, lora: LoraConfig, seed: int,
                mesh: jax.sharding.Mesh) -> Adapter:
    """A fresh adapter (B = 0: the base model's outputs) on the base of `shared`, trained with per-step AdamW."""
    with jax.set_mesh(mesh):
        model = apply_lora(nnx.merge(*base_graph), lora, seed)
    parts, params = split_lora(model, shared.hf)
    # The same base leaves as every other adapter's (apply_lora wraps the projections, it copies no weight).
    parts = parts._replace(base=shared.base)
    tx = ts.make_adam_optimizer()
    return Adapter(lora, parts, params, init_opt_state(tx, params, mesh), tx, per_step_adam=True)
