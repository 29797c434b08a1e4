"""Where a learner micro-batch spends its time: a `jax.profiler` trace of one accumulate call, per XLA op.

    .venv/bin/python bench/trace_learner.py [--model smollm2-135m-instruct] [--what ours|decoder] [--top 25]
        [--samples 8 --prompt-len 64 --completion-len 192] [--set share_prompts=false ...]

Runs one micro-batch (one group of `--samples` completions of one prompt) once to compile, once under the profiler,
and prints the total time of XLA's thunks grouped by the jax op each came from (`op_name` metadata of the compiled
HLO: `transpose(jvp(...))` is backward work) and by output shape. `--what decoder`: the decoder alone (forward and
the gradient of a linear function of its hidden states), no LM head or loss: what our step and Tunix's share.
Figures are per op on this machine's XLA backend (on CPU, ops on 2 threads overlap: the sum exceeds wall time).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

import yaml

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def op_times(trace_dir: str, hlo: str) -> collections.Counter:
    """Microseconds per (jax op, output shape), from the trace's thunk events and the HLO's metadata."""
    meta = {m.group(1): (re.sub(r"^jit\([^)]*\)/", "", m.group(3)), m.group(2))
            for m in re.finditer(r"^\s*%?([\w.-]+) = (\S+) [\w-]+\(.*?op_name=\"([^\"]+)\"", hlo, re.M)}
    trace = json.load(gzip.open(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[-1]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    totals: collections.Counter = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e["name"] in meta:
            totals[meta[e["name"]]] += e.get("dur", 0)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--what", choices=("ours", "decoder"), default="ours")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=192)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a top-level learner setting")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    from bench_learner import make_batch
    from learner import train_step as ts
    from learner.batch import pack
    from learner.config import LearnerConfig
    from learner.learner import Learner
    from learner.loss import LossOptions, token_weights
    from learner.model import forward_hidden, read_hf_config
    from common.model_cache import model_dir
    from orchestration.update import plan_update

    path = model_dir(args.model)
    hf = read_hf_config(path)
    settings = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    learner = Learner(LearnerConfig.model_validate({"grpo": {"micro_batch_size": args.samples}, **settings}), path)
    scored = make_batch(hf["vocab_size"], 1, args.samples, args.prompt_len, args.completion_len)
    batch = plan_update(learner.cfg.grpo, scored).minis[0]  # the samples with their advantages, as the loop sends them
    packed = pack(batch, learner.cfg.seq_bucket)
    learner._layout = learner._share_layout(packed, args.samples)
    rows = slice(0, args.samples)
    mb = learner._put(packed, rows, token_weights(packed.loss_mask[rows], "token-mean", 1024))

    if args.what == "ours":
        fn = ts.make_accumulate_fn(learner._parts, batch.sampling, LossOptions.of(learner.cfg.grpo), False, False,
                                   learner.cfg.logprob_chunk)
        # A fresh accumulator per call: the step donates it.
        make_args = lambda: (learner.params, learner._parts.base, jax.tree.map(jnp.zeros_like, learner.params), mb,
                             None, None)
    else:
        def decoder_loss(lora, base, mb):
            hidden, _ = forward_hidden(ts.merge(learner._parts._replace(base=base), lora), mb.tokens, mb.valid)
            return jnp.sum(hidden) * 1e-3

        fn = jax.jit(jax.grad(decoder_loss))
        make_args = lambda: (learner.params, learner._parts.base, mb)
    hlo = fn.lower(*make_args()).compile().as_text()
    jax.block_until_ready(fn(*make_args()))
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            jax.block_until_ready(fn(*make_args()))
        totals = op_times(trace_dir, hlo)
    print(f"{args.what}: {args.samples} x ({args.prompt_len} + {args.completion_len}) tokens, {args.model}, "
          f"{'prompts shared' if learner._layout and args.what == 'ours' else 'plain rows'}; op time {sum(totals.values()) / 1e6:.2f} s")
    for (op, shape), us in totals.most_common(args.top):
        print(f"{us / 1e3:9.1f} ms  {op[:110]}  {shape}")


if __name__ == "__main__":
    main()
