"""export_lora / export_merged against peft and transformers: the adapter the rollout server loads must be the
policy the learner trains, for every family (gemma3's fused kv_einsum exports as k_proj + v_proj). LoRA weights
are randomised first (B = 0 at init would make any export pass)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from learner.config import LearnerConfig
from learner.learner import Learner
from orchestration.tiny_models import TINY_FAMILIES
from test_learner_model import prompt_tokens, reference_logits

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_peft_and_merged_exports_match_the_nnx_lora_model(family, tiny_family_dir, engine_python, tmp_path):
    model_dir = tiny_family_dir(family)
    learner = Learner(LearnerConfig.model_validate({"lora": {"rank": 8, "alpha": 16}}), model_dir)
    keys = iter(jax.random.split(jax.random.key(0), 1000))
    learner.params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), learner.params)

    adapter = Path(learner.export_lora(tmp_path / "adapter"))
    merged = Path(learner.export_merged(tmp_path / "merged"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and len(config["target_modules"]) == 7
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    a = tensors["base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"]
    hf = json.loads((model_dir / "config.json").read_text())
    heads_dim = hf["num_attention_heads"] * hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
    assert a.shape == (8, heads_dim) and b.shape == (hf["intermediate_size"], 8), "PEFT: A [r, in], B [out, r]"
    assert tensors.keys() == learner.lora_tensors()[0].keys()
    layers = hf["num_hidden_layers"]
    assert len(tensors) == 2 * 7 * layers, f"{family}: {len(tensors)} tensors, not A+B x 7 x {layers}"

    tokens = prompt_tokens(2, 2, 48)  # 3x tiny-gemma3's sliding window
    ref = reference_logits(engine_python, model_dir, tokens, tmp_path, adapter=adapter, merged=merged)
    ours = learner.logits(tokens)
    assert np.abs(ref["adapter"] - ref["base"]).max() > 0.1, "adapter has no effect: the check would be vacuous"
    diff = np.abs(ours - ref["adapter"]).max()
    print(f"{family}: NNX LoRA vs peft {diff:.2e}, vs merged {np.abs(ours - ref['merged']).max():.2e}")
    assert diff <= 1e-3, f"{family}: peft vs the NNX LoRA model {diff:.2e}: Qwix->PEFT mapping broken"
    diff = np.abs(ours - ref["merged"]).max()
    assert diff <= 1e-3, f"{family}: merged-weights logits differ from the NNX LoRA model by {diff:.2e}"
