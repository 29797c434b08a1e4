"""Qwix LoRA on the Tunix model, and its PEFT view: Qwix's arrays as PEFT tensors and adapter config.

Qwix stores LoRA next to each intercepted weight (`w_lora_a/b` on Tunix `Einsum`s, `kernel_lora_a/b` on
`nnx.Linear`), with A = [*contracting dims, r] and B = [r, *output dims]. PEFT wants A as [r, in] and B as
[out, r] with HF's flattening of heads (head-major), which is exactly `A.reshape(-1, r).T` and
`B.reshape(r, -1).T` (q/k/v: B [r, heads, head_dim]; o_proj: A [heads, head_dim, r]). Both scale the update
by alpha / r, so lora_alpha = alpha.

Config targets are PEFT names; each family maps them to its Tunix modules (`FAMILY_MODULES`): llama3 / qwen2 /
qwen3 use the same names, gemma3 has q_einsum, kv_einsum (k and v fused) and attn_vec_einsum. Gemma3's kv_einsum
LoRA has one A [D, r] for k and v and B [r, 2, kv_heads, head_dim]: exported as k_proj and v_proj adapters with
the same A and B's two slices, which is the same update. The PEFT format itself (names, files, the merge math)
is common/peft_adapter.py's, shared with the engines.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import qwix
from flax import nnx

from learner import lora_delta
from learner.config import LoraConfig
from common import peft_adapter

_LORA_LEAF = re.compile(r"^(?:w|kernel)_lora_(a|b)$")
_LLAMA_MODULES = {"q_proj": ("attn", "q_proj"), "k_proj": ("attn", "k_proj"), "v_proj": ("attn", "v_proj"),
                  "o_proj": ("attn", "o_proj"), "gate_proj": ("mlp", "gate_proj"), "up_proj": ("mlp", "up_proj"),
                  "down_proj": ("mlp", "down_proj")}
# PEFT target name -> (Tunix block, Tunix module) per family. Gemma 3 fuses k and v into one einsum whose
# LoRA A is shared by both (Qwix contracts over the model dim only), so k_proj and v_proj go together.
FAMILY_MODULES: dict[str, dict[str, tuple[str, str]]] = {
    "llama3": _LLAMA_MODULES, "qwen2": _LLAMA_MODULES, "qwen3": _LLAMA_MODULES,
    "gemma3": {**_LLAMA_MODULES, "q_proj": ("attn", "q_einsum"), "k_proj": ("attn", "kv_einsum"),
               "v_proj": ("attn", "kv_einsum"), "o_proj": ("attn", "attn_vec_einsum")},
}
FUSED = {"gemma3": [("k_proj", "v_proj")]}


def _peft_targets() -> dict[str, list[str]]:
    """Tunix module -> the PEFT target(s) it holds, read off FAMILY_MODULES; a fused module lists one per slice of
    its leading axis, in the family map's order (gemma3's kv_einsum: k_proj, then v_proj)."""
    targets: dict[str, list[str]] = {}
    for modules in FAMILY_MODULES.values():
        for target, (_, module) in modules.items():
            if target not in targets.setdefault(module, []):
                targets[module].append(target)
    return targets


PEFT_TARGETS = _peft_targets()


def lora_modules(family: str, targets: tuple[str, ...] | list[str]) -> dict[str, tuple[str, str]]:
    """PEFT target -> the family's Tunix (block, module); an unknown or half-fused target is an error."""
    modules = FAMILY_MODULES.get(family)
    if modules is None:
        raise ValueError(f"LoRA has no module map for family {family!r}; families: {sorted(FAMILY_MODULES)}")
    unknown = [t for t in targets if t not in modules]
    if unknown:
        known = ", ".join(f"{t} ({'.'.join(m)})" for t, m in modules.items())
        raise ValueError(f"lora.target_modules {unknown} match no {family} module; {family} has: {known}")
    for group in FUSED.get(family, []):
        if 0 < len(set(group) & set(targets)) < len(group):
            raise ValueError(f"lora.target_modules: {family} fuses {' and '.join(group)} in one module "
                             f"({modules[group[0]][1]}); list all of {list(group)} or none")
    return {t: modules[t] for t in targets}


def model_family(model: nnx.Module) -> str:
    """Our family key of a Tunix model instance, from its class's module (tunix.models.<family>.model)."""
    parts = type(model).__module__.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["tunix", "models"] else type(model).__name__


def apply_lora(model: nnx.Module, cfg: LoraConfig, seed: int) -> nnx.Module:
    """Wrap the target projections with Qwix LoRA (B = 0, so the model's outputs are unchanged).

    Its update runs through `learner/lora_delta.py` (a backward without large transposes) from here on.
    """
    lora_delta.install()
    family = model_family(model)
    modules = sorted(set(lora_modules(family, cfg.target_modules).values()))
    alternatives = "|".join(f"{block}/{re.escape(name)}" for block, name in modules)
    provider = qwix.LoraProvider(module_path=rf"layers/\d+/(?:{alternatives})", rank=cfg.rank, alpha=cfg.alpha)
    lora_model = qwix.apply_lora_to_model(model, provider, **model.get_model_input(), rngs=nnx.Rngs(seed))
    found = {(str(p[2]), str(p[3])) for p, _ in nnx.iter_graph(lora_model) if _is_lora_path(p)}
    missing = [m for m in modules if m not in found]
    if missing:
        raise ValueError(f"LoRA targets {['.'.join(m) for m in missing]} adapted no module of this {family} model")
    return lora_model


def _is_lora_path(path: tuple) -> bool:
    return len(path) == 5 and str(path[0]) == "layers" and bool(_LORA_LEAF.match(str(path[4])))


def peft_names(path: tuple) -> list[str]:
    """PEFT tensor name(s) for a Qwix LoRA leaf path, e.g. ('layers', 0, 'attn', 'q_proj', 'w_lora_a').

    A fused module (gemma3's kv_einsum) gives one name per HF module it holds, in its leading axis's order.
    """
    keys = [str(getattr(k, "key", k)) for k in path]
    if len(keys) != 5 or keys[0] != "layers" or keys[3] not in PEFT_TARGETS or not _LORA_LEAF.match(keys[4]):
        raise ValueError(f"LoRA leaf {'.'.join(keys)} has no PEFT name: only layer projections export")
    ab = _LORA_LEAF.match(keys[4]).group(1).upper()
    return [peft_adapter.tensor_name(int(keys[1]), target, ab) for target in PEFT_TARGETS[keys[3]]]


def to_peft(value: np.ndarray, name: str, rank: int) -> np.ndarray:
    """A Qwix LoRA array in PEFT layout: A [r, in], B [out, r]."""
    if name.endswith("lora_A.weight"):
        return np.ascontiguousarray(value.reshape(-1, rank).T)
    return np.ascontiguousarray(value.reshape(rank, -1).T)


def split_fused(value: np.ndarray, names: list[str]) -> list[np.ndarray]:
    """One array per HF module of a (possibly fused) LoRA leaf.

    Fused kv_einsum: A [D, r] is shared by k and v (copied to both); B [r, 2, K, H] splits on axis 1.
    """
    if len(names) == 1:
        return [value]
    if names[0].endswith("lora_A.weight"):
        return [value] * len(names)
    if value.shape[1] != len(names):
        raise ValueError(f"fused LoRA B {value.shape} does not split into {len(names)} modules {names}")
    return [value[:, i] for i in range(len(names))]


def flat_leaves(tree: dict, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, leaf) pairs of a nested dict, depth first in key order."""
    out = []
    for k, v in tree.items():
        out.extend(flat_leaves(v, (*prefix, k)) if isinstance(v, dict) else [((*prefix, k), v)])
    return out


def peft_tensors(lora_params: dict, rank: int) -> dict[str, np.ndarray]:
    """All LoRA weights (a nested dict as `nnx.State.to_pure_dict()` gives) as float32 numpy with PEFT names."""
    out = {}
    for path, value in flat_leaves(lora_params):
        names = peft_names(path)
        for name, part in zip(names, split_fused(np.asarray(value, dtype=np.float32), names)):
            out[name] = to_peft(part, name, rank)
    return dict(sorted(out.items()))


def adapter_config(cfg: LoraConfig, base_model: str) -> dict[str, Any]:
    """The adapter_config.json of this LoRA (plain scaling: alpha / r, as Qwix's)."""
    return peft_adapter.adapter_config(cfg.rank, cfg.alpha, cfg.target_modules, base_model)
