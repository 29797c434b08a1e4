"""export_lora against peft and transformers: the adapter the rollout server loads must be the policy the learner
trains, for every family (gemma3's fused kv_einsum exports as k_proj + v_proj); and the adapter merged into the
base weights by the engines' merge math (common/peft_adapter.py, what SGLang-JAX serves) must be the same model.
LoRA weights are randomised first (B = 0 at init would make any export pass)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from learner.config import LearnerConfig
from learner.learner import Learner
from orchestration.cli.tiny_models import TINY_FAMILIES
from common.peft_adapter import merged_deltas, read_adapter
from hf_logits_oracle import reference_logits
from test_learner_model import prompt_tokens

pytestmark = pytest.mark.integration


def merged_model(base_dir: Path, adapter_dir: Path, out_dir: Path) -> Path:
    """An HF folder with the adapter folded into the base weights by `merged_deltas` (W0 + scale * B @ A)."""
    weights = {}
    for file in sorted(base_dir.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    for name, delta in merged_deltas(*read_adapter(adapter_dir)).items():
        weights[name] = (weights[name].astype(np.float32) + delta).astype(weights[name].dtype)
    out_dir.mkdir()
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for extra in base_dir.iterdir():  # config, tokenizer, generation config
        if extra.is_file() and extra.suffix != ".safetensors" and extra.name != "model.safetensors.index.json":
            shutil.copy2(extra, out_dir / extra.name)
    return out_dir


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_peft_and_merged_exports_match_the_nnx_lora_model(family, tiny_family_dir, engine_python, tmp_path):
    model_dir = tiny_family_dir(family)
    learner = Learner(LearnerConfig.model_validate({"lora": {"rank": 8, "alpha": 16}}), model_dir)
    keys = iter(jax.random.split(jax.random.key(0), 1000))
    learner.params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), learner.params)

    adapter = Path(learner.export(tmp_path / "adapter"))
    merged = merged_model(model_dir, adapter, tmp_path / "merged")
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and len(config["target_modules"]) == 7
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    a = tensors["base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"]
    hf = json.loads((model_dir / "config.json").read_text())
    heads_dim = hf["num_attention_heads"] * hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
    assert a.shape == (8, heads_dim) and b.shape == (hf["intermediate_size"], 8), "PEFT: A [r, in], B [out, r]"
    assert tensors.keys() == learner.save_for_sampler().tensors.keys()
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
