"""PEFT LoRA layout of a Llama-family checkpoint: tensor names and [r, in] / [out, r] shapes from its config.json.

`random_peft_adapter` builds a real adapter of that layout without the learner: the rollout tests (vLLM and
SGLang-JAX) and the rollout benchmarks push it to a server. Only numpy and the standard library are imported.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# HF module that holds each projection (PEFT names follow the HF module tree).
PROJ_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


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
            prefix = f"base_model.model.model.layers.{layer}.{PROJ_PARENT[proj]}.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, scale, (rank, d_in)).astype(np.float32)
            b = np.zeros((d_out, rank)) if zero_b else rng.normal(0, scale, (d_out, rank))
            tensors[f"{prefix}.lora_B.weight"] = b.astype(np.float32)
    return tensors, {"r": rank, "lora_alpha": 2 * rank, "target_modules": list(shapes)}
