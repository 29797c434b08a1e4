"""The GRPO training loop, top-down.

What GRPO means here: each step draws `train.prompts_per_step` prompts, the rollout server samples
`rollout.sampling.n` completions of each with the current LoRA adapter, the rewards score them, and the learner
turns each group's rewards into group-relative advantages and takes a clipped policy-gradient step on the LoRA
weights (importance-corrected against the engine's own logprobs). The new adapter is pushed to the server under a
new version name before the next generation, so every sample records which policy made it.

sync:  generate(k) -> learn(k) -> push(k) -> generate(k+1) ...
async: learn(k) runs in the learner actor while the driver generates step k+1 with adapter k-1 (staleness 1).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray

from learner.batch import TrainBatch
from orchestration.config import RunConfig
from orchestration.data import Prompt, PromptStream
from orchestration.inloop_eval import maybe_eval
from orchestration.metrics import MetricsLog
from orchestration.prompts import PromptRenderer
from rewards.registry import RewardSet
from rewards.types import Sample
from rollout.handle import Rollout
from rollout.types import Completion

log = logging.getLogger(__name__)


@dataclass
class Rollouts:
    """One step's generated, scored samples, plus what is needed to resume before them."""

    step: int
    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    completions: list[list[Completion]]
    stream_state: dict  # data position before these prompts were drawn
    metrics: dict[str, float] = field(default_factory=dict)
    totals: list[float] = field(default_factory=list)


@dataclass
class Parts:
    """The live components the loop drives (built by orchestration.cluster)."""

    rollout: Rollout
    learner: Any  # LearnerActor handle
    rewards: RewardSet
    stream: PromptStream
    renderer: PromptRenderer
    metrics: MetricsLog


def generate_and_score(cfg: RunConfig, parts: Parts, step: int) -> Rollouts:
    """Steps 1-3: sample prompts, generate n completions each, score them."""
    # 1. sample prompts
    stream_state = parts.stream.state_dict()
    prompts = parts.stream.next_batch()
    prompt_ids = [parts.renderer.encode(p) for p in prompts]
    # 2. generate (timing/generate)
    t0 = time.perf_counter()
    events_before = len(parts.rollout.events)
    completions = parts.rollout.generate(prompt_ids, cfg.rollout.sampling)
    t_gen = time.perf_counter() - t0
    for event in parts.rollout.events[events_before:]:
        log.warning("rollout event at step %d: %s", step, event)
    # 3. score (reward/<name>)
    t0 = time.perf_counter()
    samples = [Sample(prompt=parts.renderer.text(p), completion=c.text, reference=p.reference)
               for p, group in zip(prompts, completions) for c in group]
    result = parts.rewards.score(samples)
    t_score = time.perf_counter() - t0
    for line in result.errors:
        log.error("step %d: %s", step, line)
    flat = [c for group in completions for c in group]
    lengths = np.array([len(c.token_ids) for c in flat])
    metrics = {
        "reward/total": float(np.mean(result.totals)),
        "reward/total_std": float(np.std(result.totals)),
        **{f"reward/{name}": float(np.mean(vals)) for name, vals in result.per_name.items()},
        "reward/errors": len(result.errors),
        "rollout/completion_len_mean": float(lengths.mean()),
        "rollout/completion_len_max": int(lengths.max()),
        "rollout/truncated_frac": float(np.mean([c.finish_reason == "length" for c in flat])),
        "rollout/tokens_per_s": float(lengths.sum() / max(t_gen, 1e-9)),
        "rollout/restarts": len(parts.rollout.events) - events_before,
        "timing/generate": t_gen,
        "timing/score": t_score,
    }
    return Rollouts(step, prompts, prompt_ids, completions, stream_state, metrics, list(result.totals))


def to_train_batch(cfg: RunConfig, r: Rollouts) -> TrainBatch:
    """Step 4: flatten groups into the learner's batch (advantages are the learner's: its GRPO options)."""
    prompt_ids, completion_ids, engine_logprobs, group_ids = [], [], [], []
    for g, (ids, group) in enumerate(zip(r.prompt_ids, r.completions)):
        for c in group:
            prompt_ids.append(ids)
            completion_ids.append(list(c.token_ids))
            engine_logprobs.append(list(c.logprobs))
            group_ids.append(g)
    s = cfg.rollout.sampling
    return TrainBatch(
        prompt_ids=prompt_ids, completion_ids=completion_ids, engine_logprobs=engine_logprobs,
        rewards=np.asarray(r.totals, dtype=np.float32), group_ids=np.asarray(group_ids, dtype=np.int32),
        temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
    )


def push_adapter(parts: Parts, version: int) -> float:
    """Step 6: ship the learner's LoRA tensors to the server as a new adapter version; returns the pause (s)."""
    tensors, adapter_config = ray.get(parts.learner.lora_tensors.remote())
    return parts.rollout.push_lora(version, tensors, adapter_config)


def log_samples(run_dir: Path, r: Rollouts, renderer: PromptRenderer) -> None:
    """Keep one prompt's group of completions per step, for people reading what the policy does."""
    with (run_dir / "samples.jsonl").open("a") as f:
        group = r.completions[0]
        f.write(json.dumps({"step": r.step, "prompt": renderer.text(r.prompts[0]),
                            "completions": [c.text for c in group],
                            "rewards": r.totals[: len(group)]}) + "\n")


@dataclass
class InFlight:
    """A learner update submitted but not yet collected: if the run is interrupted, it is finished and saved."""

    step: int
    ref: Any  # ray.ObjectRef of Learner.step's metrics
    data_after: dict  # data position once this step's prompts are consumed


@dataclass
class LoopState:
    """What an interrupted run needs to save: the last finished step and the data position after it."""

    step: int
    data: dict
    saved_step: int
    in_flight: InFlight | None = None


def save_checkpoint(parts: Parts, state: LoopState) -> None:
    """Checkpoint the learner (LoRA, optimizer, RNG) with the step and the data position after it."""
    if state.in_flight is not None:
        # The learner applies an update it has started; saving it under the previous step would replay data.
        ray.get(state.in_flight.ref)
        state.step, state.data, state.in_flight = state.in_flight.step, state.in_flight.data_after, None
    ray.get(parts.learner.save.remote(state.step, {"data": state.data}))
    state.saved_step = state.step
    log.info("checkpoint saved at step %d", state.step)


def train_loop(cfg: RunConfig, parts: Parts, run_dir: Path, state: LoopState) -> None:
    """Run steps state.step+1 .. cfg.train.steps. The adapter on the server is version `state.step` on entry."""
    start_step = state.step
    version = start_step  # one learner update per step, so the policy version is the step count
    pending: Rollouts | None = None
    for step in range(start_step + 1, cfg.train.steps + 1):
        t_step = time.perf_counter()
        rollouts = pending or generate_and_score(cfg, parts, step)
        rollouts.step = step
        staleness = [version - (c.adapter_version or 0) for g in rollouts.completions for c in g]
        # 5. learner.step (timing/learn); in async mode the next generation overlaps it
        t0 = time.perf_counter()
        learn_ref = parts.learner.step.remote(to_train_batch(cfg, rollouts))
        # Resume must redraw a prefetched batch, so the position recorded is from before any prefetch.
        state.in_flight = InFlight(step, learn_ref, parts.stream.state_dict())
        pending = None
        if cfg.train.mode == "async" and step < cfg.train.steps:
            pending = generate_and_score(cfg, parts, step + 1)
        learn_metrics = ray.get(learn_ref)
        state.step, state.data, state.in_flight = step, state.in_flight.data_after, None
        t_learn = time.perf_counter() - t0
        # 6. export_lora + load_lora (timing/sync)
        t0 = time.perf_counter()
        version += 1
        pause = push_adapter(parts, version)
        t_sync = time.perf_counter() - t0
        # 7. log, maybe save
        metrics = {**rollouts.metrics, **learn_metrics,
                   "async/staleness_mean": float(np.mean(staleness)), "rollout/adapter_version": version,
                   "timing/learn": t_learn, "timing/sync": t_sync, "timing/push_pause": pause,
                   "timing/step": time.perf_counter() - t_step}
        if pending is not None:
            metrics["timing/generate_overlapped"] = pending.metrics["timing/generate"]
        parts.metrics.log(step, metrics)
        log_samples(run_dir, rollouts, parts.renderer)
        maybe_eval(cfg, parts, step)
        if step == cfg.train.steps or (cfg.train.save_every and step % cfg.train.save_every == 0):
            save_checkpoint(parts, state)
