"""Seeded tiny random models, one per supported family, each with its family's quirks, for fast tests.

Every family gets SmolLM2's tokenizer, 128 hidden units and a few layers, and keeps what makes it differ from
Llama, so a wrong config mapping or export shows up as a logit gap:
- qwen2: q/k/v biases (randomised: HF initialises them to 0, which would hide a dropped bias);
- qwen3: q/k RMSNorm on each head (weights randomised around 1), a rope base other than Tunix's hard-coded one;
- gemma3: sliding-window layers mixed with global ones in a pattern unlike Tunix's fixed 5:1 (window 16 tokens,
  far shorter than any test prompt), separate local/global rope bases, query scaling by
  query_pre_attn_scalar = hidden / heads (not head_dim), its four (1 + w) normalisers per layer and q/k norms
  (randomised around 0), multi-query attention (so Tunix uses q_einsum + kv_einsum) and tied embeddings.
  Gemma 3 has no soft caps (final/attn logit softcapping are None in the family), so none are set.
Runs in the engine env (torch + transformers). Weights are seeded, so every machine makes the same model.
"""

from __future__ import annotations

from pathlib import Path

TINY_FAMILIES = ("llama", "qwen2", "qwen3", "gemma3")
GEMMA3_WINDOW = 16


def tiny_name(family: str) -> str:
    return f"tiny-{family}"


def _config(family: str, vocab: int):
    common = dict(vocab_size=vocab, hidden_size=128, intermediate_size=256, max_position_embeddings=2048,
                  tie_word_embeddings=True, dtype="float32")
    if family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5)
    if family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           rope_theta=1000000.0, rms_norm_eps=1e-6)
    if family == "qwen3":
        from transformers import Qwen3Config

        # rope base 1e5, not Qwen3's 1e6: Tunix 0.1.7's qwen3 hard-codes 1e6, so a lost fix shows.
        return Qwen3Config(**common, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-6)
    if family == "gemma3":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(
            **common, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
            query_pre_attn_scalar=32, sliding_window=GEMMA3_WINDOW, rms_norm_eps=1e-6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        )
    raise ValueError(f"no tiny model for family {family!r}; families: {TINY_FAMILIES}")


def _model_class(family: str):
    import transformers

    return {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
            "qwen3": transformers.Qwen3ForCausalLM, "gemma3": transformers.Gemma3ForCausalLM}[family]


def make_tiny(family: str, out: Path, tok, fix_config) -> Path:
    """A seeded tiny `family` model with tokenizer `tok` at `out` (idempotent)."""
    if (out / ".complete").exists():
        return out
    import torch

    config = _config(family, len(tok))
    torch.manual_seed(0)
    model = _model_class(family)(config).to(torch.float32)
    with torch.no_grad():
        # Random init gives near-uniform logits; a larger output scale makes greedy decoding peaked and
        # sampling parameters (top_k, temperature) visibly matter in tests.
        model.get_input_embeddings().weight.mul_(8.0)
        if family != "llama":  # tiny-llama's weights predate this and stay as they were
            for name, p in model.named_parameters():
                if p.ndim == 1:  # norm scales and biases: HF's constant init would hide a dropped one
                    p.add_(0.1 * torch.randn_like(p))
    fix_config(model, tok)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / ".complete").touch()
    return out
