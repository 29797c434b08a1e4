"""PEFT LoRA adapters, the format the learner exports and every engine loads: names, files, the merge.

A PEFT adapter folder holds `adapter_model.safetensors` (per projection, A [r, in] and B [out, r], named
`base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight` after the HF module tree) and
`adapter_config.json` (r, lora_alpha, target_modules, use_rslora, ...). The learner writes it (learner/lora.py maps
Qwix's arrays to these names), the rollout actor writes each pushed version as one, vLLM loads it, and the
SGLang-JAX engine merges it into its weights: W = W0 + scale * B @ A, scale = alpha / r (alpha / sqrt(r) with
use_rslora), always from W0.

Only numpy and the standard library (safetensors inside the file functions): this module runs in the learner env
and in the engine envs, which have no jax. `random_peft_adapter` builds a real adapter of a Llama-family
checkpoint's layout without the learner (the rollout tests and benchmarks push it to servers).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# HF module that holds each projection (PEFT names follow the HF module tree).
PROJ_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# What a config lacks: the values every adapter here has (no dropout or bias at inference, plain LoRA).
PEFT_DEFAULTS: dict[str, Any] = {
    "peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none", "lora_dropout": 0.0, "fan_in_fan_out": False,
    "use_rslora": False, "use_dora": False, "inference_mode": True, "modules_to_save": None,
}
_PREFIX = "base_model.model."


def tensor_name(layer: int, proj: str, part: str) -> str:
    """The PEFT name of projection `proj`'s LoRA `part` ("A" or "B") in decoder layer `layer`."""
    return f"{_PREFIX}model.layers.{layer}.{PROJ_PARENT[proj]}.{proj}.lora_{part}.weight"


def parse_name(name: str) -> tuple[str, str]:
    """(HF weight name, "A" or "B") of a PEFT tensor name (base_model.model.model.layers.0.mlp.up_proj.lora_A...)."""
    stem = name.removeprefix(_PREFIX)
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if stem.endswith(suffix):
            return stem[: -len(suffix)] + ".weight", part
    raise ValueError(f"{name} is not a PEFT LoRA tensor (expected ...lora_A.weight / ...lora_B.weight)")


def adapter_config(rank: int, alpha: float, target_modules: list[str] | tuple[str, ...], base_model: str = "",
                   use_rslora: bool = False) -> dict[str, Any]:
    """adapter_config.json's contents (vLLM and peft read r, lora_alpha, target_modules, use_rslora)."""
    return {**PEFT_DEFAULTS, "base_model_name_or_path": base_model, "r": rank, "lora_alpha": alpha,
            "target_modules": sorted(target_modules), "use_rslora": use_rslora}


def write_adapter(out_dir: Path, tensors: dict[str, np.ndarray], config: dict[str, Any]) -> Path:
    """adapter_model.safetensors + adapter_config.json in `out_dir` (weights first, config last, so a folder with
    a config is complete); keys `config` lacks get PEFT_DEFAULTS."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.ascontiguousarray(np.asarray(t)) for name, t in tensors.items()}
    save_file(arrays, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps({**PEFT_DEFAULTS, **config}, indent=2))
    return out_dir


def read_adapter(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, config) of an adapter folder."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    return load_file(str(folder / ADAPTER_WEIGHTS)), json.loads((folder / ADAPTER_CONFIG).read_text())


def checksum(tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 of an adapter's tensors (names, dtypes, shapes and values, in name order): equal exactly when the
    weights are bit for bit the same, whichever process or file they came from."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        value = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def lora_scale(config: dict[str, Any]) -> float:
    """The factor of B @ A: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (peft's convention)."""
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    return alpha / (rank ** 0.5 if config.get("use_rslora") else rank)


def merged_deltas(tensors: dict[str, Any], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """{HF weight name: scale * B @ A} (HF layout [out, in], float32) of an adapter; W0 + delta is the merged W."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, tensor in tensors.items():
        target, part = parse_name(name)
        pairs.setdefault(target, {})[part] = np.asarray(tensor, dtype=np.float32)
    if missing := sorted(t for t, ab in pairs.items() if set(ab) != {"A", "B"}):
        raise ValueError(f"adapter lacks lora_A or lora_B for {missing[:3]}")
    factor = lora_scale(config)
    return {target: factor * (ab["B"] @ ab["A"]) for target, ab in pairs.items()}


def projection_shapes(model_dir: Path) -> tuple[int, dict[str, tuple[int, int]]]:
    """(num_layers, {proj: (in_features, out_features)}) of a Llama-family checkpoint."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q_out, kv_out = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, q_out), "k_proj": (hidden, kv_out), "v_proj": (hidden, kv_out),
              "o_proj": (q_out, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
              "down_proj": (inter, hidden)}
    return cfg["num_hidden_layers"], shapes


def random_peft_adapter(model_dir: Path, rank: int, seed: int, scale: float = 0.5,
                        zero_b: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """Seeded random LoRA tensors (PEFT names) for every projection, and their adapter_config dict.

    `zero_b=True` gives an identity adapter (B = 0): the engine must then reproduce the base model.
    """
    layers, shapes = projection_shapes(model_dir)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for proj, (d_in, d_out) in shapes.items():
            tensors[tensor_name(layer, proj, "A")] = rng.normal(0, scale, (rank, d_in)).astype(np.float32)
            b = np.zeros((d_out, rank)) if zero_b else rng.normal(0, scale, (d_out, rank))
            tensors[tensor_name(layer, proj, "B")] = b.astype(np.float32)
    return tensors, {"r": rank, "lora_alpha": 2 * rank, "target_modules": list(shapes)}
