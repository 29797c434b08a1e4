"""Why tiny-llama answers "\\n" every time at the demo's temperature, and how much a higher one spreads it. Run in
the engine's env:

    ~/.cache/aha/envs/vllm/bin/python bench/tiny_model_peak.py

On a countdown prompt rendered with the model's chat template (ending "<|im_start|>assistant\\n"), prints the top
next-token logits, the probability of the top token and the entropy at several temperatures, then the token ids of
sampled continuations (no stop string). The model's tied embeddings, scaled by 8 (orchestration/cli/tiny_models.py),
make it repeat its last input token: the prompt's closing "\\n" leads.

Pure torch and transformers: no server, no aha imports (the engine env holds none of our code).
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

SYSTEM = "You are a helpful assistant. Reply with one line: the equation, nothing else."  # the demo config's
USER = ("Using the numbers [29, 49], create an equation that equals 20. You can use + - * / and each number "
        "exactly once.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=Path.home() / ".cache/aha/models/tiny-llama")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--tokens", type=int, default=12)
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    print("prompt ends with", [(i, tok.decode([i])) for i in ids[0, -3:].tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    top = torch.topk(logits, 4)
    print("top logits", [(i, tok.decode([i]), round(v, 2)) for v, i in zip(top.values.tolist(), top.indices.tolist())])
    for t in (0.7, 1.0, 1.5, 2.0):
        probs = torch.softmax(logits / t, -1)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum().item()
        print(f"temperature {t}: p(top) {probs.max().item():.6f}, entropy {entropy:.4f} nats")
    for t in (0.7, 2.0):
        torch.manual_seed(0)
        out = model.generate(ids, max_new_tokens=args.tokens, do_sample=True, temperature=t, top_p=1.0, top_k=0,
                             num_return_sequences=args.samples)
        print(f"temperature {t}, sampled ids:", [row[ids.shape[1]:].tolist() for row in out])


if __name__ == "__main__":
    main()
