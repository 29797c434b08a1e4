"""Oracle for tests/integration/test_learner_vllm_sampler.py, run in the engine env: vLLM's own code for min_tokens,
penalties (`apply_penalties`), min-p and top-k/top-p (`apply_top_k_top_p`) on saved logits, in the order of
`Sampler.forward`; writes the processed logprobs of the targets.

usage: python vllm_sampler_oracle.py IN.npz OUT.npz"""
import sys
import numpy as np
import torch
from vllm.model_executor.layers.utils import apply_penalties
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

d = np.load(sys.argv[1], allow_pickle=True)
logits = torch.tensor(d["logits"])  # [n, V] one row per completion position
V = logits.shape[1]
pad = lambda rows: torch.tensor([r + [V] * (max(map(len, rows)) - len(r)) for r in rows] if max(map(len, rows)) else [[V]] * len(rows))
prompts, outputs = list(d["prompts"]), list(d["outputs"])
out = {}
for name, cfg in d["settings"].item().items():
    z = logits.clone()
    n = z.shape[0]
    for i in range(n):  # MinTokensLogitsProcessor: stop ids -inf while fewer than min_tokens outputs
        if len(outputs[i]) < cfg["min_tokens"]:
            z[i, list(cfg["stop"])] = float("-inf")
    full = lambda v: torch.full((n,), float(v))
    z = apply_penalties(z, pad([list(p) for p in prompts]), pad([list(o) for o in outputs]),
                        full(cfg["presence"]), full(cfg["frequency"]), full(cfg["repetition"]))
    z = z / cfg["temperature"]
    if cfg["min_p"] > 0:  # MinPLogitsProcessor.apply
        p = torch.softmax(z, -1)
        z = z.masked_fill(p < p.amax(-1, keepdim=True) * cfg["min_p"], float("-inf"))
    k = torch.full((n,), cfg["top_k"], dtype=torch.long) if cfg["top_k"] > 0 else None
    pp = full(cfg["top_p"]) if cfg["top_p"] < 1 else None
    z = apply_top_k_top_p(z, k, pp)
    lp = z.log_softmax(-1, dtype=torch.float32)
    out[name] = lp.gather(1, torch.tensor(d["targets"])[:, None])[:, 0].numpy()
np.savez(sys.argv[2], **out)
