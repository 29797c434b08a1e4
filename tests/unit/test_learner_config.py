"""LearnerConfig validation, the device slice / mesh, and HF config.json -> Tunix ModelConfig for every family.

The family mappings use synthetic config.json dicts shaped like the real Qwen2.5 / Qwen3 / Gemma 3 / Llama
ones (no weights needed); each builds the Tunix model abstractly to check the mapped sizes are consistent.
"""

from __future__ import annotations

import math

import jax
import pytest
from flax import nnx
from pydantic import ValidationError

from learner.config import LearnerConfig, MeshConfig, OptimizerConfig
from learner.mesh import learner_mesh, resolve_sizes, select_devices
from learner.model import family_of, tunix_config
from learner.config import DevicesConfig

QWEN25_05B = {"model_type": "qwen2", "num_hidden_layers": 24, "vocab_size": 151936, "hidden_size": 896,
              "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
QWEN3_06B = {"model_type": "qwen3", "num_hidden_layers": 28, "vocab_size": 151936, "hidden_size": 1024,
             "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
GEMMA3_270M = {"model_type": "gemma3_text", "num_hidden_layers": 18, "vocab_size": 262144, "hidden_size": 640,
               "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
               "query_pre_attn_scalar": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
               "sliding_window": 512, "rope_scaling": None}
SMOLLM2 = {"model_type": "llama", "num_hidden_layers": 30, "vocab_size": 49152, "hidden_size": 576,
           "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "rope_theta": 100000.0,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": True}


@pytest.mark.parametrize("bad,where", [
    ({"optimizer": {"lr": -1}}, "lr"),
    ({"grpo": {"loss_agg": "sum"}}, "loss_agg"),
    ({"lora": {"target_modules": ["qproj"]}}, "target_modules"),
    ({"mesh": {"axis_names": ["data"], "axis_sizes": [-1]}}, "Tunix"),
    ({"mesh": {"axis_names": ["fsdp", "tp"], "axis_sizes": [-1, -1]}}, "at most one -1"),
    ({"learning_rate": 1e-5}, "learning_rate"),
])
def test_bad_config_names_the_field(bad, where):
    with pytest.raises(ValidationError, match=where):
        LearnerConfig.model_validate(bad)


def test_device_slice_and_mesh_on_fake_devices():
    devices = jax.devices()
    assert len(devices) == 4, "conftest should give 4 fake CPU devices"
    mesh = learner_mesh(DevicesConfig(offset=2, count=2), MeshConfig())
    assert [d.id for d in mesh.devices.flat] == [2, 3] and dict(mesh.shape) == {"fsdp": 2, "tp": 1}
    mesh = learner_mesh(DevicesConfig(offset=1), MeshConfig(axis_names=("tp", "fsdp"), axis_sizes=(1, -1)))
    assert [d.id for d in mesh.devices.flat] == [1, 2, 3]
    with pytest.raises(ValueError, match="does not fit the 4 visible devices"):
        select_devices(DevicesConfig(offset=3, count=2))
    with pytest.raises(ValueError, match="make the sizes multiply to 3"):
        resolve_sizes(MeshConfig(axis_sizes=(2, 1)), 3)


def _abstract(family: str, cfg):
    import importlib

    module = importlib.import_module(f"tunix.models.{family}.model")
    cls = {"llama3": "Llama3", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma3": "Gemma3"}[family]
    return nnx.eval_shape(lambda: getattr(module, cls)(cfg, rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("hf", [SMOLLM2, QWEN25_05B, QWEN3_06B, GEMMA3_270M], ids=lambda h: h["model_type"])
def test_family_config_mapping(hf):
    family = family_of(hf)
    cfg = tunix_config(hf)
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    assert (cfg.num_layers, cfg.embed_dim, cfg.hidden_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        hf["num_hidden_layers"], hf["hidden_size"], hf["intermediate_size"], heads, kv, head_dim)
    if family == "gemma3":
        assert cfg.num_embed == hf["vocab_size"] and cfg.sliding_window_size == 512
        assert (cfg.local_base_frequency, cfg.global_base_frequency) == (10_000, 1_000_000)
    else:
        assert cfg.vocab_size == hf["vocab_size"] and cfg.rope_theta == hf["rope_theta"]
    model = _abstract(family, cfg)
    assert len(model.layers) == hf["num_hidden_layers"]


def test_unsupported_model_type_and_rope_scaling_are_one_line_errors():
    with pytest.raises(ValueError, match="model_type 'mistral' is not supported"):
        family_of({"model_type": "mistral"})
    with pytest.raises(ValueError, match="rope_scaling"):
        tunix_config({**SMOLLM2, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})


def test_cosine_schedule_decays_after_warm_up_and_holds_its_floor():
    from learner.train_step import learning_rate

    lr = learning_rate(OptimizerConfig(lr=1e-3, warmup_steps=2, schedule="cosine", decay_steps=4, final_lr_ratio=0.1))
    got = [float(lr(i)) for i in range(8)]
    assert got[:3] == pytest.approx([0.0, 5e-4, 1e-3]), "linear warm-up to lr"
    assert got[3] == pytest.approx(1e-4 + 0.9e-3 * (1 + math.cos(math.pi / 4)) / 2, rel=1e-5)
    assert got[6:] == pytest.approx([1e-4, 1e-4]), "held at final_lr_ratio x lr after decay_steps"
    assert all(a >= b for a, b in zip(got[2:], got[3:])), "not decaying"
    assert learning_rate(OptimizerConfig(lr=1e-3)) == 1e-3, "the default stays a constant"
    with pytest.raises(ValidationError, match="cosine needs optimizer.decay_steps > 0"):
        OptimizerConfig(schedule="cosine")
