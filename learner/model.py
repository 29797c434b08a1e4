"""Load an HF safetensors folder into Tunix's Flax NNX model classes, config built from config.json.

Families: llama (SmolLM2, Llama 3), qwen2 (Qwen2.5), qwen3, gemma3 (text). The Tunix `ModelConfig` is derived
from the checkpoint's own config.json, never from a hand-typed preset, so a model with a different size or
rope base loads correctly or fails with the field that is not supported.

Tunix 0.1.7's llama3 and qwen3 attention call `apply_rope` without `rope_theta`, so every model runs with
theta = 1e6 whatever its config says (SmolLM2 uses 1e5: logits off by up to 4.7). We fix it on our side:
`_RopeFixed` subclasses re-run Tunix's own `Attention.block` code with an `apply_rope` bound to the model's
theta (same code object, different globals), and the loaded model's attention modules are switched to them.
Nothing in site-packages is edited and no module-level global is patched. This, the Gemma 3 layer attributes and
the LM head's class swap reach into Tunix's internals: each checks the pinned Tunix first (common/pins.py).
"""

from __future__ import annotations

import functools
import json
import types
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from common.pins import require_pinned

# family name in config.json "model_type" -> our family key
MODEL_TYPES = {"llama": "llama3", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3", "gemma3_text": "gemma3"}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def read_hf_config(model_path: Path) -> dict[str, Any]:
    """config.json of an HF folder (text_config flattened in for multimodal Gemma 3)."""
    path = Path(model_path) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: model_path must be an HF folder with config.json and *.safetensors")
    hf = json.loads(path.read_text())
    if "text_config" in hf:
        hf = {**hf, **hf["text_config"], "model_type": hf["text_config"].get("model_type", hf["model_type"])}
    return hf


def family_of(hf: dict[str, Any]) -> str:
    model_type = hf.get("model_type", "?")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {sorted(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]


def _check_rope_scaling(hf: dict[str, Any], allowed: tuple[str, ...] = ()) -> None:
    scaling = hf.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind and kind not in ("default", *allowed):
        raise ValueError(
            f"rope_scaling {scaling} is not supported by Tunix's {hf['model_type']} model; "
            "use a checkpoint without rope scaling (context extension) for training"
        )


def head_dim(hf: dict[str, Any]) -> int:
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def _rope_theta(hf: dict[str, Any], default: float) -> float:
    # transformers >= 5 moves rope_theta into rope_parameters.
    return float(hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta") or default)


def tunix_config(hf: dict[str, Any], param_dtype: str = "float32", remat: bool = False):
    """The Tunix ModelConfig for an HF config dict (llama/qwen2/qwen3/gemma3)."""
    family = family_of(hf)
    dtype = DTYPES[param_dtype]
    if family in ("llama3", "qwen2", "qwen3"):
        import importlib

        m = importlib.import_module(f"tunix.models.{family}.model")
        _check_rope_scaling(hf)
        tied = bool(hf.get("tie_word_embeddings", False))
        # The two Tunix families name tied embeddings differently; Qwen's also takes the dtypes (Llama's infers them).
        own = ({"weight_tying": tied} if family == "llama3"
               else {"use_tied_embedding": tied, "dtype": dtype, "param_dtype": dtype})
        return m.ModelConfig(
            num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
            hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=head_dim(hf),
            num_kv_heads=hf["num_key_value_heads"], rope_theta=_rope_theta(hf, 10000.0 if family == "llama3" else 1e6),
            norm_eps=hf["rms_norm_eps"], remat_config=m.RematConfig.DECODER if remat else m.RematConfig.NONE, **own,
        )
    return _gemma3_config(hf, dtype, remat)


def _gemma3_rope(hf: dict[str, Any]) -> dict[str, float]:
    """Local (sliding) and global rope base and linear scale factor, from either transformers layout."""
    params = hf.get("rope_parameters") or {}
    if "sliding_attention" in params:  # transformers >= 5: one rope dict per layer type
        local, full = params["sliding_attention"], params.get("full_attention", {})
    else:  # transformers 4: rope_theta + rope_local_base_freq + rope_scaling (global layers only)
        local = {"rope_theta": hf.get("rope_local_base_freq", 10_000.0)}
        full = {**(hf.get("rope_scaling") or {}), "rope_theta": _rope_theta(hf, 1e6)}
    for kind, rope in (("sliding_attention", local), ("full_attention", full)):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear"):
            raise ValueError(f"gemma3 {kind} rope_type {rope_type!r} is not supported by Tunix (default, linear)")
    return {"local_base_frequency": float(local.get("rope_theta", 10_000.0)),
            "local_scale_factor": float(local.get("factor", 1.0)),
            "global_base_frequency": float(full.get("rope_theta", 1e6)),
            "global_scale_factor": float(full.get("factor", 1.0))}


def _check_gemma3(hf: dict[str, Any]) -> None:
    """Gemma 3 features Tunix's model lacks: refuse them instead of computing something else."""
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(cap) is not None:
            raise ValueError(f"gemma3 {cap}={hf[cap]}: Tunix's gemma3 has no soft cap (Gemma 3 checkpoints set None)")
    if abs(float(hf.get("rms_norm_eps", 1e-6)) - 1e-6) > 1e-12:  # GGUFs store 1e-6 as float32 (9.99999997e-7)
        raise ValueError(f"gemma3 rms_norm_eps={hf['rms_norm_eps']}: Tunix's gemma3 RMSNorm hard-codes 1e-6")
    if not hf.get("tie_word_embeddings", True):
        raise ValueError("gemma3 tie_word_embeddings=false: Tunix's gemma3 decodes with the input embedding")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("gemma3 use_bidirectional_attention=true (an encoder) is not a causal LM to train")


def gemma3_layer_types(hf: dict[str, Any]) -> list[str]:
    """'sliding_attention' / 'full_attention' per layer (config.json's layer_types, else its pattern)."""
    n = hf["num_hidden_layers"]
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]


def _gemma3_config(hf: dict[str, Any], dtype, remat: bool):
    from tunix.models.gemma3 import model as m

    _check_gemma3(hf)
    dim = head_dim(hf)
    # Gemma 3 scales queries by query_pre_attn_scalar**-0.5; Tunix offers head_dim or embed_dim / heads.
    scalar = hf.get("query_pre_attn_scalar", dim)
    if scalar == dim:
        norm = m.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM
    elif scalar == hf["hidden_size"] // hf["num_attention_heads"]:
        norm = m.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
    else:
        raise ValueError(f"gemma3 query_pre_attn_scalar={scalar} is neither head_dim nor hidden_size / heads")
    return m.ModelConfig(
        num_layers=hf["num_hidden_layers"], num_embed=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=dim,
        num_kv_heads=hf["num_key_value_heads"], sliding_window_size=hf.get("sliding_window"),
        **_gemma3_rope(hf), query_pre_attn_norm=norm,
        remat_config=m.RematConfig.DECODER if remat else m.RematConfig.NONE, param_dtype=dtype,
    )


def fix_gemma3_layers(model: nnx.Module, hf: dict[str, Any]) -> None:
    """Give each layer the attention type config.json says (Tunix cycles a fixed 5 local : 1 global pattern)."""
    from tunix.models.gemma3 import model as m

    require_pinned("google-tunix", "learner/model.py fix_gemma3_layers")
    cfg = model.config
    for layer, kind in zip(model.layers, gemma3_layer_types(hf), strict=True):
        local = kind == "sliding_attention"
        if not local and kind != "full_attention":
            raise ValueError(f"gemma3 layer type {kind!r}: expected sliding_attention or full_attention")
        layer.attn.attn_type = m.AttentionType.LOCAL_SLIDING if local else m.AttentionType.GLOBAL
        layer.attn.rope_base_frequency = cfg.local_base_frequency if local else cfg.global_base_frequency
        layer.attn.rope_scale_factor = cfg.local_scale_factor if local else cfg.global_scale_factor


@functools.cache
def _block_with_theta(block: types.FunctionType, rope_theta: float) -> types.FunctionType:
    """Tunix's `Attention.block`, run with an `apply_rope` that uses `rope_theta` (cached per theta)."""
    apply_rope = functools.partial(block.__globals__["apply_rope"], rope_theta=rope_theta)
    fn = types.FunctionType(block.__code__, {**block.__globals__, "apply_rope": apply_rope}, block.__name__,
                            block.__defaults__, block.__closure__)
    fn.__kwdefaults__ = block.__kwdefaults__
    return fn


@functools.cache
def _rope_fixed_class(attention_cls: type) -> type:
    """A subclass of a Tunix Attention whose `block` honours `config.rope_theta`."""

    def block(self, *args, **kwargs):
        return _block_with_theta(attention_cls.block, float(self.config.rope_theta))(self, *args, **kwargs)

    return type(f"RopeFixed{attention_cls.__name__}", (attention_cls,), {"block": block, "__module__": __name__})


def fix_rope_theta(model: nnx.Module, family: str) -> None:
    """Make llama3/qwen3 attention use the configured rope_theta (Tunix 0.1.7 hard-codes 1e6)."""
    if family not in ("llama3", "qwen3"):
        return  # qwen2 passes rope_theta itself; gemma3 passes its local/global base frequencies
    require_pinned("google-tunix", "learner/model.py fix_rope_theta")
    for layer in model.layers:
        layer.attn.__class__ = _rope_fixed_class(type(layer.attn))


def load_model(model_path: Path, mesh: jax.sharding.Mesh | None, param_dtype: str = "float32", remat: bool = False):
    """Build the Tunix NNX model for an HF folder and load its safetensors onto `mesh`; returns (model, family)."""
    hf = read_hf_config(model_path)
    family = family_of(hf)
    cfg = tunix_config(hf, param_dtype, remat)
    if family == "gemma3":
        from tunix.models.gemma3 import params_safetensors as params
    else:
        import importlib

        params = importlib.import_module(f"tunix.models.{family}.params")
    if not list(Path(model_path).glob("*.safetensors")):
        raise FileNotFoundError(f"no *.safetensors in {model_path}: convert the checkpoint to safetensors first")
    model = params.create_model_from_safe_tensors(str(model_path), cfg, mesh=mesh, dtype=DTYPES[param_dtype])
    fix_rope_theta(model, family)
    if family == "gemma3":
        fix_gemma3_layers(model, hf)
    return model, family


def forward_logits(model: nnx.Module, tokens: jax.Array, valid: jax.Array) -> jax.Array:
    """Logits [B, L, V] for right-padded `tokens` (positions 0..L-1, causal, pad keys masked)."""
    length = tokens.shape[1]
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    causal = jnp.tril(jnp.ones((length, length), bool))
    mask = causal[None] & valid[:, None, :]
    logits, _ = model(tokens, positions, None, mask)
    return logits


def _identity(self, x):
    return x


@functools.cache
def _hidden_class(cls: type) -> type:
    """A subclass of an LM-head module (Einsum `__call__`, Embedder `decode`) whose output is its input."""
    return type(f"HiddenOut{cls.__name__}", (cls,), {"__call__": _identity, "decode": _identity,
                                                     "__module__": __name__})


def hidden_out(model: nnx.Module) -> Callable[[jax.Array], jax.Array]:
    """Switch the model's LM head to the identity (on this merged copy only: call it on a model built inside the
    traced function) and return the head as a function: hidden [..., D] -> fp32 logits [..., V], for callers
    that apply it only where they need logits. Tied families (gemma3, tied llama/qwen) decode with the input
    embedding, the others with `lm_head`."""
    require_pinned("google-tunix", "learner/model.py hidden_out")
    head_module = getattr(model, "lm_head", None)
    if head_module is not None:
        w = head_module.w[...]  # [D, V]
        head_module.__class__ = _hidden_class(type(head_module))
        return lambda h: jnp.einsum("...D,DV->...V", h.astype(w.dtype), w).astype(jnp.float32)
    emb = model.embedder.input_embedding[...]  # [V, D]
    model.embedder.__class__ = _hidden_class(type(model.embedder))
    return lambda h: jnp.dot(h.astype(emb.dtype), emb.T).astype(jnp.float32)


def forward_hidden(model: nnx.Module, tokens: jax.Array, valid: jax.Array):
    """(final-norm hidden states [B, L, D], head: hidden [..., D] -> fp32 logits [..., V]) for right-padded tokens
    (see `hidden_out`)."""
    head = hidden_out(model)
    return forward_logits(model, tokens, valid), head
