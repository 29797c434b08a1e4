"""Several adapters as one stacked LoRA, for a pass that runs several tenants' datums together.

Each LoRA leaf of the stack is its adapters' leaves zero-padded to one rank R and stacked: A [T, k, R] and
B [T, R, n] (learner/lora_rows.py runs each row through its own slot). Zero padding is exact: a padded column of A
meets a zero row of B, so the update is the adapter's own, and both get zero gradient. A target one adapter does not
train is a zero A and B in its slot (no update, zero gradient). The stacked graph is Qwix's LoRA at rank R and
alpha R on the shared base, so Qwix's own scale is 1 and each row's alpha / r is applied per row.

A pass's program is keyed by (slots, R, targets) and the batch's shapes, not by which adapters fill the slots: a new
client whose rank fits a compiled R compiles nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner import train_step as ts
from learner.adapters import Adapter, split_lora
from learner.config import LoraConfig
from learner.lora import apply_lora, flat_leaves

# LoRA leaves and the axis of their rank: a Linear's A [k, r] and B [r, n]; an Einsum's A [*contracted, r] (last)
# and B [r, *out] (first).
RANK_AXIS = {"kernel_lora_a": -1, "kernel_lora_b": 0, "w_lora_a": -1, "w_lora_b": 0}


@dataclass(frozen=True)
class TenantStack:
    """The adapters of one pass: their names in slot order, the stacked graph and its weights."""

    names: tuple[str, ...]
    parts: ts.ModelParts
    params: dict  # each leaf [slots, ...]
    scale: np.ndarray  # float32 [slots]: each slot's alpha / rank (0 for an empty slot)

    def rows(self, adapters: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(slot index per datum of `adapters`, each slot's scale)."""
        return np.asarray([self.names.index(a) for a in adapters], np.int32), self.scale


def stackable(adapter: Adapter) -> bool:
    """Whether an adapter's leaves are all ones per-row LoRA computes (Linear and Einsum projections)."""
    return all(path[-1] in RANK_AXIS for path, _ in flat_leaves(adapter.params))


def pass_rank(loras: list[LoraConfig]) -> int:
    """The rank a pass pads to: the largest of its adapters', rounded up to a power of two (few programs)."""
    return 1 << (max(lora.rank for lora in loras) - 1).bit_length()


def stacked_parts(base_graph: tuple, shared: ts.ModelParts, rank: int, targets: tuple[str, ...],
                  mesh: jax.sharding.Mesh) -> ts.ModelParts:
    """The graph of a stack of `rank` over `targets` on the shared base (its own LoRA weights are discarded)."""
    with jax.set_mesh(mesh):
        model = apply_lora(nnx.merge(*base_graph), LoraConfig(rank=rank, alpha=rank, target_modules=targets), 0)
    parts, _ = split_lora(model, shared.hf)
    return parts._replace(base=shared.base)


def stack(names: tuple[str, ...], adapters: list[Adapter], parts: ts.ModelParts, slots: int) -> TenantStack:
    """`adapters` stacked into `slots` slots of the graph `parts` (their rank at most its; empty slots zero)."""
    template = parts.lora_template.to_pure_dict()
    stacked: dict = {}
    for path, shape in flat_leaves(template):
        leaves = []
        for a in adapters:
            leaf = _get(a.params, path)
            leaves.append(jnp.zeros(shape.shape, shape.dtype) if leaf is None else _pad(leaf, path[-1], shape.shape))
        leaves += [jnp.zeros(shape.shape, shape.dtype)] * (slots - len(adapters))
        _set(stacked, path, jnp.stack(leaves))
    scale = np.zeros(slots, np.float32)
    scale[: len(adapters)] = [a.lora.alpha / a.lora.rank for a in adapters]
    return TenantStack(names, parts, stacked, scale)


def unstack(grads: dict, adapters: list[Adapter]) -> list[dict]:
    """Each adapter's share of a stacked gradient, in its own leaves' shapes and shardings."""
    out = []
    for slot, a in enumerate(adapters):
        own: dict = {}
        for path, leaf in flat_leaves(a.params):
            g = _get(grads, path)[slot]
            g = jax.lax.slice_in_dim(g, 0, a.lora.rank, axis=RANK_AXIS[path[-1]] % g.ndim)
            _set(own, path, jax.device_put(g.astype(leaf.dtype), leaf.sharding))
        out.append(own)
    return out


def _pad(leaf: jax.Array, name: str, shape: tuple[int, ...]) -> jax.Array:
    axis = RANK_AXIS[name] % leaf.ndim
    widths = [(0, 0)] * leaf.ndim
    widths[axis] = (0, shape[axis] - leaf.shape[axis])
    return jnp.pad(leaf, widths)


def _get(tree: dict, path: tuple) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
