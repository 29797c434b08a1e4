"""Test oracle: reference logits from transformers (+ peft), what the learner's NNX model must reproduce.

Runs in the engine env (torch, transformers, peft), as a script, never imported by the learner:
    python tests/integration/hf_logits_oracle.py MODEL_DIR_OR_GGUF IN.npz OUT.npz [--adapter DIR] [--merged DIR]
        [--second MODEL_DIR_OR_GGUF]
IN.npz holds `tokens` [B, L] (int); OUT.npz gets `base` (the model alone), and `adapter` (peft with the
adapter) / `merged` (a merged HF folder) / `second` (another model, e.g. the folder prepared from a GGUF: one process
instead of two, torch and transformers imported once) when asked: float32 logits [B, L, V]. Python 3.11, no jax.
Tests in the learner env call it through `reference_logits`.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import numpy as np


def reference_logits(engine_python: Path, model_dir: Path, tokens: np.ndarray, tmp_path: Path, **extra) -> dict:
    """Run this file in the engine env on `tokens`; returns its npz as a dict (from the learner env's tests)."""
    inp, out = tmp_path / "tokens.npz", tmp_path / "ref.npz"
    np.savez(inp, tokens=tokens)
    cmd = [str(engine_python), str(Path(__file__).resolve()), str(model_dir), str(inp), str(out)]
    for k, v in extra.items():
        cmd += [f"--{k}", str(v)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference computation failed:\n{proc.stderr[-3000:]}")
    return dict(np.load(out))


def logits_of(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


def load(model: str):
    """An HF folder, or a .gguf file (dequantised to float32 by transformers' GGUF loader)."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    path = Path(model)
    where, gguf = (path.parent, {"gguf_file": path.name}) if path.suffix == ".gguf" else (path, {})
    return AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, attn_implementation="eager", **gguf).eval()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("inp")
    parser.add_argument("out")
    parser.add_argument("--adapter")
    parser.add_argument("--merged")
    parser.add_argument("--second")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokens = np.load(args.inp)["tokens"]
    base = load(args.model_dir)
    out = {"base": logits_of(base, tokens)}
    if args.adapter:
        from peft import PeftModel

        out["adapter"] = logits_of(PeftModel.from_pretrained(base, args.adapter).eval(), tokens)
    if args.merged:
        out["merged"] = logits_of(load(args.merged), tokens)
    if args.second:
        del base  # one model in memory at a time
        out["second"] = logits_of(load(args.second), tokens)
    np.savez(args.out, **out)


if __name__ == "__main__":
    main()
