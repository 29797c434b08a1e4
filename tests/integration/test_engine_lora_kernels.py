"""Our CPU LoRA path (rollout/engine_ext/aha_vllm_cpu_lora.py) gives vLLM's own results, in the engine env.

vLLM's functions are kept by the module before it swaps them (`ORIGINAL`); both run on the same random inputs for
each index pattern the engine produces: one adapter for every token (our batches, the fast path), several
adapters, and -1 (a base-model token: no contribution; the reference gives -1 an all-zero slot, since vLLM's
indexing takes the last real slot). The served model with an adapter is checked against HF + PEFT in
test_rollout_lora.py, which runs this path inside a real server.
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


def with_empty_slot(weights, idx):
    # The reference for index -1 (no adapter: no contribution): vLLM's own function on the same weights plus one
    # all-zero slot that every -1 points to (vLLM's indexing would take the last real slot instead).
    empty = torch.zeros_like(weights[:1])
    return torch.cat([weights, empty]), torch.where(idx < 0, weights.shape[0], idx)


for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
    assert getattr(lora_ops, name) is getattr(ours, name) and getattr(punica_cpu, name) is getattr(ours, name), name
assert punica_cpu.PunicaWrapperCPU.add_lora_linear is ours.add_lora_linear
torch.manual_seed(0)
slots, tokens, rank, hidden, out = 3, 37, 8, 48, 40
patterns = {"one": torch.full((tokens,), 1), "mixed": torch.randint(0, slots, (tokens,)),
            "unset": torch.randint(-1, slots, (tokens,)), "none": torch.full((tokens,), -1)}
worst = 0.0
for label, idx in patterns.items():
    x = torch.randn(tokens, hidden)
    a = torch.randn(slots, 1, rank, hidden)
    b = torch.randn(slots, 1, out, rank)
    h = torch.randn(tokens, rank)
    for fn, w in (("bgmv_shrink", a), ("bgmv_expand", b), ("bgmv_expand_slice", b)):
        w_ref, idx_ref = with_empty_slot(w, idx)
        inputs = x if fn == "bgmv_shrink" else h
        for add in (False, True):
            width = rank + 2 if fn == "bgmv_shrink" else out + 16 if fn == "bgmv_expand_slice" else out
            base = torch.randn(tokens, width)
            got, want = base.clone(), base.clone()
            extra = {"bgmv_shrink": (0.5,), "bgmv_expand": (add,), "bgmv_expand_slice": (8, out, add)}[fn]
            getattr(ours, fn)(inputs, w, got, idx, *extra)
            ours.ORIGINAL[fn](inputs, w_ref, want, idx_ref, *extra)
            err = (got - want).abs().max().item()
            assert err < 1e-4, (label, fn, add, err)
            worst = max(worst, err)
    # A whole LoRA projection (3 output slices, as a fused q/k/v) through the wrapper, decode and prefill layout.
    wrapper = punica_cpu.PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=4, device="cpu")
    sizes = (out, 16, 16)
    a3 = tuple(torch.randn(slots, 1, rank, hidden) for _ in sizes)
    b3 = tuple(torch.randn(slots, 1, n, rank) for n in sizes)
    ref = [with_empty_slot(t, idx) for t in a3 + b3]
    wrapper._token_lora_indices[:tokens] = idx
    wrapper.indices_len[0] = tokens
    y0 = torch.randn(tokens, sum(sizes))
    got = y0.clone()
    ours.add_lora_linear(wrapper, got, x, a3, b3, 0.25, sizes)
    want = y0.clone()
    wrapper._token_lora_indices[:tokens] = ref[0][1]
    ours.ORIGINAL["add_lora_linear"](wrapper, want, x, tuple(t for t, _ in ref[:3]), tuple(t for t, _ in ref[3:]),
                                     0.25, sizes)
    err = (got - want).abs().max().item()
    assert err < 1e-4, (label, "add_lora_linear", err)
    worst = max(worst, err)
print("max abs diff", worst)
"""


def test_our_lora_kernels_equal_vllms(engine_python):
    ext = ROOT / "rollout" / "engine_ext"
    proc = subprocess.run([str(engine_python), "-c", CHECK, str(ext)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "max abs diff" in proc.stdout
