"""Our CPU LoRA kernels (rollout/engine_ext/aha_vllm_cpu_lora.py) give vLLM's own results, in the engine env.

vLLM's functions are kept by the module before it swaps them (`ORIGINAL`); both run on the same random inputs for
each index pattern the engine produces: one adapter for every token (our batches), several adapters, and -1 (no
adapter; vLLM's indexing takes it from the end). The served model with an adapter is checked against HF + PEFT in
test_rollout_lora.py, which runs these kernels inside a real server.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHECK = r"""
import sys
sys.path.insert(0, sys.argv[1])
import torch
import aha_vllm_cpu_lora as ours
from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu

for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
    assert getattr(lora_ops, name) is getattr(ours, name) and getattr(punica_cpu, name) is getattr(ours, name), name
torch.manual_seed(0)
slots, tokens, rank, hidden, out = 3, 37, 8, 48, 40
patterns = {"one": torch.full((tokens,), 1), "mixed": torch.randint(0, slots, (tokens,)),
            "unset": torch.randint(-1, slots, (tokens,))}
worst = 0.0
for label, idx in patterns.items():
    x = torch.randn(tokens, hidden)
    a = torch.randn(slots, 1, rank, hidden)
    b = torch.randn(slots, 1, out, rank)
    h = torch.randn(tokens, rank)
    for fn, args in (("bgmv_shrink", (x, a)), ("bgmv_expand", (h, b)), ("bgmv_expand_slice", (h, b))):
        for add in (False, True):
            base = torch.randn(tokens, out + 16 if fn == "bgmv_expand_slice" else out)
            got, want = base.clone(), base.clone()
            if fn == "bgmv_shrink":
                got, want = torch.zeros(tokens, rank + 2), torch.zeros(tokens, rank + 2)
                ours.bgmv_shrink(*args, got, idx, 0.5)
                ours.ORIGINAL[fn](*args, want, idx, 0.5)
            elif fn == "bgmv_expand":
                ours.bgmv_expand(*args, got, idx, add)
                ours.ORIGINAL[fn](*args, want, idx, add)
            else:
                ours.bgmv_expand_slice(*args, got, idx, 8, out, add)
                ours.ORIGINAL[fn](*args, want, idx, 8, out, add)
            err = (got - want).abs().max().item()
            assert err < 1e-4, (label, fn, add, err)
            worst = max(worst, err)
print("max abs diff", worst)
"""


def test_our_lora_kernels_equal_vllms(engine_python):
    ext = ROOT / "rollout" / "engine_ext"
    proc = subprocess.run([str(engine_python), "-c", CHECK, str(ext)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "max abs diff" in proc.stdout
