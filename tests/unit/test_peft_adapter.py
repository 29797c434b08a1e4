"""common/peft_adapter.py, the one PEFT module the learner and the engines share: names, files and the merge math."""

from __future__ import annotations

import numpy as np
import pytest

from common import peft_adapter


def test_merged_deltas_scale_and_names():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 16)).astype(np.float32), rng.normal(size=(8, 4)).astype(np.float32)
    name = "base_model.model.model.layers.1.self_attn.q_proj"
    deltas = peft_adapter.merged_deltas({f"{name}.lora_A.weight": a, f"{name}.lora_B.weight": b},
                                        {"r": 4, "lora_alpha": 8})
    np.testing.assert_allclose(deltas["model.layers.1.self_attn.q_proj.weight"], 2.0 * b @ a, rtol=1e-6)
    rs = peft_adapter.merged_deltas({f"{name}.lora_A.weight": a, f"{name}.lora_B.weight": b},
                                    {"r": 4, "lora_alpha": 8, "use_rslora": True})
    np.testing.assert_allclose(rs["model.layers.1.self_attn.q_proj.weight"], 4.0 * b @ a, rtol=1e-6)
    with pytest.raises(ValueError, match="lacks lora_A or lora_B"):
        peft_adapter.merged_deltas({f"{name}.lora_A.weight": a}, {"r": 4})
    with pytest.raises(ValueError, match="not a PEFT LoRA tensor"):
        peft_adapter.parse_name("model.layers.0.mlp.up_proj.weight")


def test_an_adapter_written_reads_back_with_peft_defaults(tmp_path):
    """What the learner exports and the rollout actor writes is one format: names that parse to the HF weight they
    adapt, the tensors unchanged, and a config vLLM and peft accept (type, dropout, bias filled in)."""
    rng = np.random.default_rng(1)
    tensors = {peft_adapter.tensor_name(3, "down_proj", ab): rng.normal(size=shape).astype(np.float32)
               for ab, shape in (("A", (4, 32)), ("B", (16, 4)))}
    assert peft_adapter.parse_name(peft_adapter.tensor_name(3, "down_proj", "B")) == (
        "model.layers.3.mlp.down_proj.weight", "B")
    folder = peft_adapter.write_adapter(tmp_path / "adapter", tensors, {"r": 4, "lora_alpha": 8,
                                                                        "target_modules": ["down_proj"]})
    read, config = peft_adapter.read_adapter(folder)
    assert read.keys() == tensors.keys() and all(np.array_equal(read[k], tensors[k]) for k in tensors)
    assert config["peft_type"] == "LORA" and config["lora_dropout"] == 0.0 and config["use_rslora"] is False
    assert config == {**peft_adapter.PEFT_DEFAULTS, "r": 4, "lora_alpha": 8, "target_modules": ["down_proj"]}


def test_checksum_is_equal_exactly_when_the_weights_are():
    """What summary.json's `resumed.lora_sha256` rests on: name order does not matter, one ulp or a dtype does."""
    a = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones((3, 2), np.float32)}
    same = {"a": np.ones((3, 2), np.float32), "b": np.arange(6, dtype=np.float32).reshape(2, 3).T.copy().T}
    assert peft_adapter.checksum(a) == peft_adapter.checksum(same)
    nudged = {**a, "a": np.nextafter(a["a"], np.float32(2))}
    assert peft_adapter.checksum(nudged) != peft_adapter.checksum(a)
    assert peft_adapter.checksum({**a, "a": a["a"].astype(np.float64)}) != peft_adapter.checksum(a)
