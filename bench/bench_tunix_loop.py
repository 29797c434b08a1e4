"""Tunix's own colocated GRPO loop, timed per step, as a baseline for our loop's step time.

Runs `tunix.rl.grpo.grpo_learner.GRPOLearner` on an `RLCluster` with the "vanilla" rollout engine: Tunix's JAX
sampler generates, our rewards score, Tunix's GRPO loss updates the LoRA, all in this one process on one mesh
(actor and rollout share the same weights, so there is no weight sync). Everything but the sizes is read from
the demo config (`--config`, default configs/countdown_smollm2_cpu.yaml), so `tunix_step_s` can be set beside
our `timing/step`:

- model: our `learner.model.load_model` (the config's dtype and remat, rope theta fixed) + `learner.lora.apply_lora`
  (rank 16, alpha 32 in the demo), traced with Qwix's own LoRA update (`learner.lora_delta.stock_qwix`), as Tunix
  ships it; optimizer: our `make_optimizer` (AdamW lr 3e-4, b2 0.99, clip 1.0);
- prompts: the config's data (countdown train split) in PromptStream order, chat template + assistant prefix;
  `--prompts-per-step` prompts x `--n` generations, all generated in one sampler call as vLLM batches them;
- sampling: the config's temperature and top_p (1.0, 1.0), no top-k, `--max-tokens` new tokens;
- rewards: `rewards.setup_rewards(cfg.rewards)` (format 0.5 + countdown 1.0), summed in one Tunix reward function;
- GRPO: the config's kl_beta 0 (so no reference model is built or run), one iteration, its clip (0.2 / 0.28),
  token-mean loss, std-normalised advantages.

A "step" is one call of Tunix's `_run_global_step`: fetch the batch, generate, decode, score, advantages, the
forward/backward of every micro-batch and the optimizer update, waited on to completion. Step 1 includes the
compiles and is left out of the mean.

How it differs from our loop (read the ratio with these in mind):
- no rollout server: Tunix samples in the learner's process with its own sampler (static KV cache, prompts
  left-padded to the longest prompt of the run, one jitted while-loop), on the same cores as the update; our loop
  sends token ids over HTTP to vLLM-CPU in another process and pushes the LoRA to it after each step;
- no stop string: the vanilla sampler stops only at EOS, so the batch decodes until every row hits <|im_end|> or
  the token budget (vLLM stops each row at the config's stop string "</answer>"). Completions are cut there
  before scoring, so rewards see what vLLM would return, but Tunix trains on (and pays for) the tokens after it;
- micro-batches are whole prompt groups in Tunix (`train_micro_batch_size` counts prompts), so the demo's 4
  sequences become max(1, 4 // n) prompts = n sequences per forward/backward;
- the loss runs over prompt + completion padded to fixed lengths (longest prompt + max tokens), ours over
  64-token buckets of the real lengths; Tunix also computes the token entropy from the full logits;
- no importance-sampling correction against the engine (with one iteration Tunix takes the old logprobs to be the
  current ones; neither loop runs a separate old-logprob forward at the demo's settings); token-mean is taken per
  micro-batch and averaged by Tunix, over the whole batch by us; the sampler's seed is the same every step.

    .venv/bin/python bench/bench_tunix_loop.py                      # SmolLM2, 4 steps, the demo's sizes
    nice -n 19 .venv/bin/python bench/bench_tunix_loop.py --model tiny-llama --steps 2 --max-tokens 16 --n 4

Defaults are the demo's sizes (2 prompts x 8, 96 tokens); `--model` replaces the config's model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]

from common.model_cache import SMOLLM2, TINY, model_dir  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "countdown_smollm2_cpu.yaml")
    p.add_argument("--model", choices=[SMOLLM2, TINY], default=SMOLLM2)
    p.add_argument("--steps", type=int, default=4, help="GRPO steps; the first (compile) is left out of the mean")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--n", type=int, default=8, help="generations per prompt (GRPO group size)")
    p.add_argument("overrides", nargs="*", default=["learner.grpo.kl_beta=0.0"],
                   help="config overrides (default: the demo's KL term off, which this loop does not mirror)")
    args = p.parse_args()
    if args.steps < 2:
        p.error(f"--steps {args.steps}: need >= 2, the first step compiles and is not timed")
    if args.n < 2:
        p.error(f"--n {args.n}: GRPO needs >= 2 generations per prompt")
    return args


def build_batches(data, model_path: Path, prompts_per_step: int, steps: int) -> tuple[list[dict], object, int]:
    """Tunix input batches (prompt text + reference JSON), the tokenizer, and the longest prompt in tokens."""
    import numpy as np

    from tasks import PromptStream, setup_dataset
    from tasks.render import PromptRenderer

    renderer = PromptRenderer(model_path, data.assistant_prefix)
    stream = PromptStream(setup_dataset(data, "train"), prompts_per_step, data.seed)
    batches, longest = [], 0
    bos = renderer.tokenizer.bos_token_id
    for _ in range(steps):
        prompts = stream.next_batch()
        texts = [renderer.text(p) for p in prompts]
        for text in texts:  # Tunix's Sampler.tokenize: bos + encode(text), a doubled bos removed
            ids = renderer.tokenizer.encode(text)
            longest = max(longest, len(ids) + (bos is not None and ids[:1] != [bos]))
        batches.append({"prompts": np.array(texts), "reference": np.array([json.dumps(p.reference) for p in prompts])})
    return batches, renderer.tokenizer, longest


def cut_at_stop(text: str, stops: list[str], keep: bool) -> str:
    """The text vLLM would return for these stop strings (the vanilla sampler stops only at EOS)."""
    hits = [(text.index(s), s) for s in stops if s in text]
    if not hits:
        return text
    at, stop = min(hits)
    return text[: at + len(stop) * keep]


def setup_reward_fn(rewards_cfg, sampling):
    """The config's weighted rewards as one Tunix reward function (Tunix sums its functions unweighted)."""
    from rewards import Sample, setup_rewards

    reward_set = setup_rewards(rewards_cfg)
    keep = bool(sampling.extra.get("include_stop_str_in_output", False))

    def weighted_rewards(prompts, completions, reference, **_):
        cut = [cut_at_stop(c, sampling.stop, keep) for c in completions]
        samples = [Sample(str(p), c, json.loads(str(r))) for p, c, r in zip(prompts, cut, reference)]
        return list(reward_set.score(samples).totals)

    return weighted_rewards


def build_learner(args: argparse.Namespace, cfg, model_path: Path, tokenizer, prompt_len: int):
    """Our model + LoRA on our learner mesh, wrapped in a colocated Tunix RLCluster and GRPOLearner."""
    import jax
    from tunix.rl import rl_cluster as rl
    from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner
    from tunix.rl.rollout.base_rollout import RolloutConfig

    from learner.lora import apply_lora
    from learner.mesh import learner_mesh
    from learner.model import load_model
    from learner.train_step import make_optimizer

    lc, grpo_cfg, sampling = cfg.learner, cfg.learner.grpo, cfg.rollout.sampling
    if grpo_cfg.kl_beta != 0 or grpo_cfg.epochs != 1 or grpo_cfg.mini_batch_size is not None:
        raise ValueError("this benchmark mirrors kl_beta 0, epochs 1, one mini-batch (the demo's); got "
                         f"{grpo_cfg.kl_beta}, {grpo_cfg.epochs}, {grpo_cfg.mini_batch_size}")
    mesh = learner_mesh(lc.devices, lc.mesh)
    with jax.set_mesh(mesh):
        model, _ = load_model(model_path, mesh, lc.param_dtype, lc.remat)
        model = apply_lora(model, lc.lora, lc.seed)
    micro_prompts = max(1, grpo_cfg.micro_batch_size // args.n)  # Tunix's micro-batches count prompts
    if args.prompts_per_step % micro_prompts:
        raise ValueError(f"--prompts-per-step {args.prompts_per_step} is not a multiple of the micro-batch "
                         f"({micro_prompts} prompts); Tunix needs whole micro-batches")
    training = rl.RLTrainingConfig(
        actor_optimizer=make_optimizer(lc.optimizer),
        eval_every_n_steps=10**9, max_steps=args.steps,
        mini_batch_size=args.prompts_per_step, train_micro_batch_size=micro_prompts,
        rollout_micro_batch_size=args.prompts_per_step, compute_logps_micro_batch_size=args.prompts_per_step,
    )
    rollout = RolloutConfig(max_tokens_to_generate=args.max_tokens, max_prompt_length=prompt_len,
                            kv_cache_size=prompt_len + args.max_tokens, temperature=sampling.temperature,
                            top_p=sampling.top_p, top_k=None)
    roles = {role: mesh for role in (rl.Role.ACTOR, rl.Role.REFERENCE, rl.Role.ROLLOUT)}
    cluster = rl.RLCluster(actor=model, reference=None, tokenizer=tokenizer, cluster_config=rl.ClusterConfig(
        role_to_mesh=roles, rollout_engine="vanilla", training_config=training, rollout_config=rollout))
    grpo = GRPOConfig(num_generations=args.n, num_iterations=1, beta=0.0, epsilon=grpo_cfg.clip_eps_low,
                      loss_agg_mode="token-mean")
    grpo.epsilon_high = grpo_cfg.clip_eps_high  # read by Tunix's loss via hasattr; not a GRPOConfig field in 0.1.7
    learner = GRPOLearner(rl_cluster=cluster, algo_config=grpo, reward_fns=[setup_reward_fn(cfg.rewards, sampling)])
    if learner.should_sync_weights:
        raise RuntimeError("Tunix sees separate actor and rollout weights; this benchmark expects them shared "
                           "(one mesh), otherwise the per-step weight sync would fall outside the timed step")
    return learner, micro_prompts


def instrument(learner, steps: int) -> dict[str, list[float]]:
    """Time each `_run_global_step` (one GRPO step) and the generate call inside it; print a line per step."""
    times: dict[str, list[float]] = {"step": [], "generate": []}
    run_step, generate = learner._run_global_step, learner.rl_cluster.generate

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        times["generate"].append(time.perf_counter() - t0)
        return out

    def timed_step(*args, **kwargs):
        t0, calls = time.perf_counter(), len(times["generate"])
        run_step(*args, **kwargs)
        times["step"].append(time.perf_counter() - t0)
        k, gen_s = len(times["step"]), sum(times["generate"][calls:])
        note = "  (compile, not in the mean)" if k == 1 else ""
        print(f"tunix step {k}/{steps}: {times['step'][-1]:.2f} s (generate {gen_s:.2f} s){note}", flush=True)

    # Instance attributes shadow the methods; Tunix calls both through `self`, so every step goes through them.
    learner._run_global_step = timed_step
    learner.rl_cluster.generate = timed_generate
    return times


def main() -> None:
    args = parse_args()
    from orchestration.config.files import load_config

    cfg = load_config(args.config, args.overrides)
    if cfg.learner.grpo.loss_agg != "token-mean" or not cfg.learner.grpo.std_normalize:
        raise ValueError(f"{args.config}: this benchmark mirrors token-mean loss with std-normalised advantages")
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    model_path = model_dir(args.model)
    batches, tokenizer, prompt_len = build_batches(cfg.data, model_path, args.prompts_per_step, args.steps)
    learner, micro_prompts = build_learner(args, cfg, model_path, tokenizer, prompt_len)
    print(f"tunix GRPO: {args.model}, {args.prompts_per_step} prompts x {args.n}, max_tokens {args.max_tokens}, "
          f"prompt padded to {prompt_len} tokens, micro-batch {micro_prompts * args.n} sequences", flush=True)
    times = instrument(learner, args.steps)
    from learner.lora_delta import stock_qwix

    with stock_qwix():  # Tunix as it ships: Qwix's own LoRA update and its autodiff backward
        learner.train(batches)
    if len(times["step"]) != args.steps or len(times["generate"]) != args.steps:
        raise RuntimeError(f"expected {args.steps} steps with one generate call each, timed {len(times['step'])} "
                           f"steps and {len(times['generate'])} generate calls: Tunix's loop changed shape")
    print(f"tunix_step_s: {statistics.mean(times['step'][1:]):.2f}")
    print(f"tunix_generate_s: {statistics.mean(times['generate'][1:]):.2f}")
    print(f"peak_rss_gb: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f}")


if __name__ == "__main__":
    main()
