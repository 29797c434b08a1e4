"""Qwix LoRA on the Tunix model, and its PEFT view: tensors, adapter_config.json, files, merged weights.

Qwix stores LoRA next to each intercepted weight (`w_lora_a/b` on Tunix `Einsum`s, `kernel_lora_a/b` on
`nnx.Linear`), with A = [*contracting dims, r] and B = [r, *output dims]. PEFT wants A as [r, in] and B as
[out, r] with HF's flattening of heads (head-major), which is exactly `A.reshape(-1, r).T` and
`B.reshape(r, -1).T` (q/k/v: B [r, heads, head_dim]; o_proj: A [heads, head_dim, r]). Both scale the update
by alpha / r, so lora_alpha = alpha.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import qwix
from flax import nnx

from learner.config import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Tunix module name -> HF module name (llama3 / qwen2 / qwen3 layouts).
HF_BLOCK = {"attn": "self_attn", "mlp": "mlp"}
_LORA_LEAF = re.compile(r"^(?:w|kernel)_lora_(a|b)$")


def apply_lora(model: nnx.Module, cfg: LoraConfig, seed: int) -> nnx.Module:
    """Wrap the target projections with Qwix LoRA (B = 0, so the model's outputs are unchanged)."""
    targets = "|".join(re.escape(t) for t in cfg.target_modules)
    provider = qwix.LoraProvider(module_path=f".*(?:{targets})", rank=cfg.rank, alpha=cfg.alpha)
    return qwix.apply_lora_to_model(model, provider, **model.get_model_input(), rngs=nnx.Rngs(seed))


def peft_name(path: tuple) -> str:
    """PEFT tensor name for a Qwix LoRA leaf path, e.g. ('layers', 0, 'attn', 'q_proj', 'w_lora_a')."""
    keys = [str(getattr(k, "key", k)) for k in path]
    if len(keys) != 5 or keys[0] != "layers" or keys[2] not in HF_BLOCK or not _LORA_LEAF.match(keys[4]):
        raise ValueError(f"LoRA leaf {'.'.join(keys)} has no PEFT name: only llama/qwen layer projections export")
    ab = _LORA_LEAF.match(keys[4]).group(1).upper()
    return f"base_model.model.model.layers.{keys[1]}.{HF_BLOCK[keys[2]]}.{keys[3]}.lora_{ab}.weight"


def to_peft(value: np.ndarray, name: str, rank: int) -> np.ndarray:
    """A Qwix LoRA array in PEFT layout: A [r, in], B [out, r]."""
    if name.endswith("lora_A.weight"):
        return np.ascontiguousarray(value.reshape(-1, rank).T)
    return np.ascontiguousarray(value.reshape(rank, -1).T)


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
        name = peft_name(path)
        out[name] = to_peft(np.asarray(value, dtype=np.float32), name, rank)
    return dict(sorted(out.items()))


def adapter_config(cfg: LoraConfig, base_model: str) -> dict[str, Any]:
    """PEFT adapter_config.json contents (vLLM and peft read r, lora_alpha, target_modules)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(cfg.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
    }


def write_peft(out_dir: Path, tensors: dict[str, np.ndarray], config: dict[str, Any]) -> Path:
    """adapter_config.json + adapter_model.safetensors in `out_dir` (weights first, config last)."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    return out_dir


def write_merged(base_dir: Path, out_dir: Path, tensors: dict[str, np.ndarray], config: dict[str, Any]) -> Path:
    """HF folder with W + (alpha / r) B A folded into the base weights (for servers without LoRA)."""
    from safetensors.numpy import load_file, save_file

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scale = config["lora_alpha"] / config["r"]
    files = sorted(base_dir.glob("*.safetensors"))
    weights: dict[str, np.ndarray] = {}
    for f in files:
        weights.update(load_file(str(f)))
    for name, a in tensors.items():
        if not name.endswith("lora_A.weight"):
            continue
        b = tensors[name.replace("lora_A", "lora_B")]
        hf_name = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        if hf_name not in weights:
            raise KeyError(f"{hf_name} not in {base_dir}: the adapter does not belong to this base model")
        w = weights[hf_name]
        weights[hf_name] = (w.astype(np.float32) + scale * (b @ a)).astype(w.dtype)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for extra in base_dir.iterdir():  # config, tokenizer, generation config
        if extra.is_file() and extra.suffix != ".safetensors" and not extra.name.startswith("."):
            if extra.name != "model.safetensors.index.json":
                shutil.copy2(extra, out_dir / extra.name)
    return out_dir
