"""Learner benchmark: one GRPO train step on the issue's batch, against this CPU's own matmul speed and Tunix.

    .venv/bin/python bench/bench_learner.py [--model smollm2-135m-instruct] [--steps 2] [--tunix]
        [--vs logprob_chunk=0 --vs seq_bucket=16 ...] [--prompts 8 --samples 8 --prompt-len 64 --completion-len 192]

Batch: 8 prompts x 8 samples, 64 prompt + 192 completion tokens, LoRA r16 (defaults of LearnerConfig); the flags
change it (the demo's shape: --prompts 4 --samples 8 --prompt-len 64 --completion-len 32).
Prints, measured in this one run:
- step_s: our steady-state step time (median after one compile step; with --tunix the timed steps
  alternate ours / Tunix's so machine noise hits both);
- mfu_cpu = achieved model FLOP/s / measured f32 matmul FLOP/s of this machine (FLOPs: forward + the backward
  to activations, which is what a frozen-base LoRA step costs; LoRA's own matmuls are negligible; decoder
  tokens as run: each prompt once where `learner.share_prompts`, the default, applied, every row's otherwise);
- peak RSS of the process;
- with --tunix: a step with Tunix's own GRPO loss (`algo_core.grpo_loss_fn` + `nnx.Optimizer`, same model,
  LoRA weights, batch, micro-batching, traced with Qwix's own LoRA update and its autodiff backward as Tunix ships
  it, not ours of `learner/lora_delta.py`) and ratio = ours / Tunix's. It is Tunix's loss path, not the whole
  GRPOLearner loop (which also owns rollout and threading), so it compares the train step alone;
- with --vs KEY=VALUE (repeatable): the same step by a learner with that `learner.` setting changed, and the
  ratio of each to ours (the default config), e.g. `--vs logprob_chunk=0` (the dense reference: LM head and
  log-softmax at every position, [batch, length, vocab] fp32), `--vs seq_bucket=16` (less padding) or
  `--vs share_prompts=false` (every sample runs its prompt through the decoder, as Tunix's loss does).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import yaml

os.environ.setdefault("JAX_PLATFORMS", "cpu")

def make_batch(vocab: int, prompts: int, samples: int, prompt_len: int, completion_len: int, seed: int = 0):
    import numpy as np

    from orchestration.update import ScoredSamples

    rng = np.random.default_rng(seed)
    n = prompts * samples
    prompt_ids = [list(p) for p in rng.integers(3, vocab, (prompts, prompt_len)).repeat(samples, 0)]
    completions = [list(rng.integers(3, vocab, completion_len)) for _ in range(n)]
    logprobs = [list(-rng.random(completion_len) * 2) for _ in range(n)]
    return ScoredSamples(prompt_ids, completions, logprobs, rng.random(n), np.repeat(np.arange(prompts), samples))


def matmul_flops_per_s(n: int = 2048, reps: int = 5) -> float:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        f(a).block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - t)


def step_flops(hf: dict, tokens: int, seq: int, head_tokens: int) -> float:
    """Forward + activation-gradient FLOPs (2x forward) of one step over `tokens` tokens of length `seq`; the LM
    head counts only at the `head_tokens` positions that need it (the completion's), so MFU counts needed work."""
    d, f, layers, v = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"], hf["vocab_size"]
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    hd = hf.get("head_dim") or d // heads
    per_layer = d * heads * hd * 2 + d * kv * hd * 2 + 3 * d * f  # q, o, k, v, mlp
    forward = 2 * tokens * layers * per_layer + 2 * head_tokens * d * v + layers * 4 * tokens * seq * heads * hd
    return 2.0 * forward


def time_steps(steps: dict, batch, repeats: int) -> dict[str, float]:
    """Median seconds per step of each named step function, after one compile step each.

    With several functions the timed steps alternate (a, b, a, b, ...), so a slow spell of a shared machine hits
    both sides instead of one.
    """
    for label, step in steps.items():
        t = time.perf_counter()
        step(batch)
        print(f"{label}: first step (with compile) {time.perf_counter() - t:.1f}s", flush=True)
    times: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(repeats):
        for label, step in steps.items():
            t = time.perf_counter()
            step(batch)
            times[label].append(time.perf_counter() - t)
            print(f"{label}: step {time.perf_counter() - t:.1f}s", flush=True)
    return {label: statistics.median(ts) for label, ts in times.items()}


def tunix_step_fn(learner, batch, samples: int):
    """A train step built from Tunix's GRPO loss on the learner's own model (same LoRA, same micro-batches)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from tunix.rl import algo_core, common
    from tunix.rl.grpo.grpo_learner import GRPOConfig

    from learner import train_step as ts
    from learner.lora_delta import stock_qwix

    # Own copy of the LoRA: our step donates (frees) learner.params, and the two steps alternate.
    model = ts.merge(learner._parts, jax.tree.map(jnp.copy, learner.params))
    optimizer = nnx.Optimizer(model, optax.adamw(learner.cfg.optimizer.lr), wrt=nnx.LoRAParam)
    algo = GRPOConfig(num_generations=samples, beta=0.0, loss_agg_mode="token-mean")
    algo.temperature = 1.0
    micro = learner.cfg.grpo.micro_batch_size

    @nnx.jit
    def micro_grads(model, example):
        loss = lambda m: algo_core.grpo_loss_fn(m, example, algo, 0, 2)[0]
        return nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)

    @nnx.jit
    def apply(model, optimizer, grads):
        optimizer.update(model, grads)

    prompts = jnp.asarray(np.asarray(batch.prompt_ids, np.int32))
    comps = jnp.asarray(np.asarray(batch.completion_ids, np.int32))
    adv = jnp.asarray(algo_core.compute_advantages(np.asarray(batch.rewards, np.float32), samples))

    def step(_batch):
        total = None
        for lo in range(0, len(prompts), micro):
            s = slice(lo, lo + micro)
            ex = common.TrainExample(prompt_ids=prompts[s], prompt_mask=jnp.ones_like(prompts[s]),
                                     completion_ids=comps[s], completion_mask=jnp.ones(comps[s].shape, jnp.float32),
                                     advantages=adv[s], ref_per_token_logps=None, old_per_token_logps=None)
            with stock_qwix():  # the first call traces: with Qwix's own LoRA update, as Tunix runs it
                g = micro_grads(model, ex)
            total = g if total is None else jax.tree.map(jnp.add, total, g)
        apply(model, optimizer, total)
        jax.block_until_ready(nnx.state(model, nnx.LoRAParam))

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--tunix", action="store_true", help="also time Tunix's GRPO loss step")
    parser.add_argument("--vs", action="append", default=[], metavar="KEY=VALUE",
                        help="also time a learner with this learner setting changed (dotted, e.g. grpo.epochs=2)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=192)
    parser.add_argument("--seq-bucket", type=int, help="learner.seq_bucket (default: LearnerConfig's)")
    args = parser.parse_args()

    from learner.config import LearnerConfig
    from learner.learner import Learner
    from learner.model import read_hf_config
    from common.model_cache import model_dir
    from orchestration.update import grpo_step

    path = model_dir(args.model)
    hf = read_hf_config(path)
    cfg = LearnerConfig.model_validate({"grpo": {"micro_batch_size": args.micro_batch},
                                        **({"seq_bucket": args.seq_bucket} if args.seq_bucket else {})})
    learner = Learner(cfg, path)
    batch = make_batch(hf["vocab_size"], args.prompts, args.samples, args.prompt_len, args.completion_len)
    peak_flops = matmul_flops_per_s()
    steps = {"ours": lambda scored: grpo_step(learner, learner.cfg.grpo, scored)}
    for change in args.vs:
        key, _, value = change.partition("=")
        tree = cfg.model_dump()
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node[part]
        node[leaf] = yaml.safe_load(value)
        changed = Learner(LearnerConfig.model_validate(tree), path)
        steps[change] = lambda scored, changed=changed: grpo_step(changed, changed.cfg.grpo, scored)
    if args.tunix:
        steps["tunix"] = tunix_step_fn(learner, batch, args.samples)
    medians = time_steps(steps, batch, args.steps)
    ours = medians["ours"]
    seq = args.prompt_len + args.completion_len
    # Decoder tokens the step runs: where the learner shared prompts, each prompt once, then the completions.
    tokens = len(batch) * seq
    if learner._layout is not None:
        tokens = args.prompts * args.prompt_len + len(batch) * args.completion_len
    achieved = step_flops(hf, tokens, seq, len(batch) * args.completion_len) / ours
    print(f"batch: {args.prompts} prompts x {args.samples} samples x {args.completion_len} tokens "
          f"(+{args.prompt_len} prompt), "
          f"{args.model}, LoRA r{cfg.lora.rank}, micro-batch {args.micro_batch}; medians of {args.steps} step(s)")
    print(f"step_s: {ours:.2f}", flush=True)
    print(f"achieved: {achieved / 1e9:.1f} GFLOP/s; matmul peak here: {peak_flops / 1e9:.1f} GFLOP/s; "
          f"mfu_cpu = {achieved / peak_flops:.3f}")
    for change in args.vs:
        print(f"{change}: step_s {medians[change]:.2f}; ratio {change} / ours = {medians[change] / ours:.3f}")
    if args.tunix:
        theirs = medians["tunix"]
        print(f"tunix_loss_step_s: {theirs:.2f}; ratio ours/tunix = {ours / theirs:.3f} (target <= 0.9)")
    print(f"peak_rss_gb: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f}")


if __name__ == "__main__":
    main()
