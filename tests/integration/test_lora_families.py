"""LoRA targets per family: PEFT names in the config become each family's Tunix modules, and every target
adapts one module per layer (gemma3's fused kv_einsum counts for both k_proj and v_proj). A target that
matches nothing is an error naming the family's modules, never a silent no-op."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.config import LLAMA_PROJECTIONS, LoraConfig
from learner.lora import apply_lora, lora_modules, peft_tensors
from learner.lora_delta import stock_qwix
from learner.model import forward_logits, load_model, read_hf_config
from orchestration.cli.tiny_models import TINY_FAMILIES

pytestmark = pytest.mark.integration
TUNIX_NAMES = {"llama": "q_proj k_proj v_proj o_proj", "qwen2": "q_proj k_proj v_proj o_proj",
               "qwen3": "q_proj k_proj v_proj o_proj", "gemma3": "q_einsum kv_einsum kv_einsum attn_vec_einsum"}


def adapted_modules(model: nnx.Module) -> Counter:
    """(Tunix module name) -> how many layers got a LoRA A on it."""
    return Counter(str(p[3]) for p, _ in nnx.iter_graph(model)
                   if len(p) == 5 and str(p[4]) in ("w_lora_a", "kernel_lora_a"))


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_target_adapts_one_module_per_layer(family, tiny_family_dir):
    path = tiny_family_dir(family)
    layers = read_hf_config(path)["num_hidden_layers"]
    attn = dict(zip(("q_proj", "k_proj", "v_proj", "o_proj"), TUNIX_NAMES[family].split()))
    model, _ = load_model(path, mesh=None)
    model = apply_lora(model, LoraConfig(rank=4, alpha=8), seed=0)
    expected = Counter({attn.get(t, t): layers for t in LLAMA_PROJECTIONS})
    assert adapted_modules(model) == expected
    tensors = peft_tensors(nnx.state(model, nnx.LoRAParam).to_pure_dict(), rank=4)
    per_target = Counter(name.split(".")[-3] for name in tensors)
    assert per_target == Counter({t: 2 * layers for t in LLAMA_PROJECTIONS}), "one A and one B per target and layer"


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_attention_only_targets_leave_the_mlp_alone(family, tiny_family_dir):
    model, _ = load_model(tiny_family_dir(family), mesh=None)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    model = apply_lora(model, LoraConfig(rank=4, alpha=8, target_modules=targets), seed=0)
    assert set(adapted_modules(model)) == set(TUNIX_NAMES[family].split())


def test_unknown_and_half_fused_targets_are_errors_naming_the_modules():
    with pytest.raises(ValueError, match=r"match no gemma3 module.*q_proj \(attn.q_einsum\)"):
        lora_modules("gemma3", ["qkv_proj"])
    with pytest.raises(ValueError, match=r"gemma3 fuses k_proj and v_proj.*kv_einsum"):
        lora_modules("gemma3", ["q_proj", "k_proj"])
    assert lora_modules("qwen3", ["k_proj"]) == {"k_proj": ("attn", "k_proj")}


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_lora_gradients_equal_qwix_autodiff(family, tiny_family_dir):
    """The model's LoRA update runs through learner/lora_delta.py (its own backward); every LoRA gradient of a
    whole forward equals the one Qwix's own update and JAX's autodiff give, in every family."""
    model, _ = load_model(tiny_family_dir(family), mesh=None)
    model = apply_lora(model, LoraConfig(rank=4, alpha=8), seed=0)
    lora = nnx.state(model, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(lora))))
    nnx.update(model, jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape, p.dtype) * 0.05, lora))
    tokens = jax.random.randint(jax.random.key(4), (2, 12), 3, 200)
    valid = jnp.ones(tokens.shape, bool)
    graph, params, rest = nnx.split(model, nnx.LoRAParam, ...)

    def loss(params):
        logits = forward_logits(nnx.merge(graph, params, rest), tokens, valid)
        return jnp.sum(jax.nn.log_softmax(logits)[..., :8])

    ours = jax.grad(loss)(params)
    with stock_qwix():
        stock = jax.grad(loss)(params)
    flat_ours, flat_stock = jax.tree.leaves(ours), jax.tree.leaves(stock)
    assert len(flat_ours) == len(flat_stock) == len(jax.tree.leaves(lora))
    for got, want in zip(flat_ours, flat_stock):  # float32 sums in another order: 1e-4 of the tensor's scale
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.abs(want).max()))
    assert any(float(jnp.abs(g).max()) > 0 for g in flat_ours)
