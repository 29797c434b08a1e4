"""The GRPO training loop, top-down.

What GRPO means here: each step draws `train.prompts_per_step` prompts, the rollout server samples
`rollout.sampling.n` completions of each with the current LoRA adapter, the rewards score them, and the learner
turns each group's rewards into group-relative advantages and takes a clipped policy-gradient step on the LoRA
weights (importance-corrected against the engine's own logprobs). The new adapter is pushed to the server under a
new version name before the next generation, so every sample records which policy made it.

With an `environment:`, a sample is a multi-turn episode instead of one completion (tasks/episodes.py): the
episodes of all groups run concurrently, and the learner trains on the model's tokens only (environment tokens are
masked out of the loss and the ratio). The loop is otherwise the same, async mode and staleness included.

sync:  generate(k) -> learn(k) -> push(k) -> generate(k+1) ...
async: while learn(k) runs in the learner actor, the driver generates ahead up to step k + train.max_staleness
       with the adapter it has (version k-1), so a sample is at most max_staleness versions behind its update.

With `train.dynamic_sampling` a step draws more prompts until its batch holds enough groups whose rewards vary
(orchestration/dynamic_sampling.py). Each request's seed comes from (train.seed, step, prompt index), the index
counting over all of a step's draws, so a resumed run draws the same samples as an uninterrupted one. The phases
(generate, refill, score, learn, push, save, between) are where `orchestration.faults` can land a test fault.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from learner.batch import TrainBatch
from learner.group import LearnerProcessLost
from learner.sampling import SamplingTransform, model_eos_ids
from orchestration.config.schema import RunConfig
from tasks import Prompt, PromptStream
from orchestration.dynamic_sampling import Drawn, fill_batch
from orchestration.engine_check import check_engine_agreement
from tasks.episodes import EpisodeSample, episode_metrics, play
from orchestration.problem import run_limits
from orchestration.faults import NO_FAULTS, FaultHook
from orchestration.inloop_eval import maybe_eval
from orchestration.judge import judge_step_metrics
from orchestration.metrics import MetricsLog
from orchestration.run_dir import RunDir
from tasks.environments.base import Environment
from tasks.render import PromptRenderer
from rewards.registry import RewardSet
from rewards.types import Sample, TrainingProgress
from rollout.capabilities import takes_request_seeds
from rollout.handle import Rollout
from common.sampling import Completion

log = logging.getLogger(__name__)


class LearnerDied(RuntimeError):
    """The learner actor is gone: nothing more can be learned or saved in this process."""


@dataclass
class Rollouts:
    """One step's generated, scored samples, plus where the data stream stands before and after them."""

    step: int
    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    completions: list[list[Completion]]
    stream_state: dict  # data position before these prompts were drawn
    stream_after: dict  # data position once they are drawn (what a checkpoint after this step records)
    metrics: dict[str, float] = field(default_factory=dict)
    totals: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each prompt as the model read it (chat template applied)


@dataclass
class Parts:
    """The live components the loop drives (built by orchestration.cluster.launch)."""

    rollout: Rollout
    learner: Any  # LearnerActor handle
    rewards: RewardSet
    stream: PromptStream
    renderer: PromptRenderer
    metrics: MetricsLog
    run_dir: RunDir
    environment: Environment | None = None  # multi-turn: every sample is an episode of it


def request_seeds(cfg: RunConfig, step: int, count: int, first: int = 0) -> list[int] | None:
    """Per-request seeds from (train.seed, step, prompt index) for indices first .. first+count-1 (a dynamic-sampling
    refill continues the step's index); None for an engine that cannot take them."""
    if not takes_request_seeds(cfg.rollout.backend):  # rollout/capabilities.py: vllm-tpu rejects a per-request seed
        return None
    return [int(np.random.SeedSequence([cfg.train.seed, step, i]).generate_state(1)[0] >> 1)
            for i in range(first, first + count)]


def generate(cfg: RunConfig, parts: Parts, prompts: list[Prompt], step: int, first: int,
             on_sent) -> tuple[list[list[int]], list[str], list[list[Completion]]]:
    """(prompt ids, prompt texts, n completions per prompt): one completion per sample, or with an environment one
    episode per sample (tasks/episodes.py; its prompt is the environment's opening). Request seeds count
    from prompt index `first` (a dynamic-sampling refill continues the step's index)."""
    seeds = request_seeds(cfg, step, len(prompts), first)
    if parts.environment is None:
        prompt_ids = [parts.renderer.encode(p) for p in prompts]
        completions = parts.rollout.generate(prompt_ids, cfg.rollout.sampling, seeds=seeds, on_sent=on_sent)
        return prompt_ids, [parts.renderer.text(p) for p in prompts], completions
    groups = play(parts.rollout, parts.renderer, parts.environment, prompts, cfg.rollout.sampling,
                  run_limits(cfg), seeds, on_sent, cfg.rollout.client.max_concurrency)
    return [g.prompt_ids for g in groups], [g.text for g in groups], [g.samples for g in groups]


def draw_groups(cfg: RunConfig, parts: Parts, step: int, count: int, first: int = 0,
                fault: FaultHook = NO_FAULTS) -> Drawn:
    """Draw `count` prompts, generate n completions (or episodes) each (request seeds from prompt index `first`),
    score them."""
    # 1. sample prompts
    prompts = parts.stream.next_batch(count)
    # 2. generate (timing/generate); a refill draw's requests are the fault phase "refill"
    t0 = time.perf_counter()
    events_before = len(parts.rollout.events)
    phase = "generate" if first == 0 else "refill"
    prompt_ids, texts, completions = generate(cfg, parts, prompts, step, first, lambda: fault(phase, step))
    t_gen = time.perf_counter() - t0
    for event in parts.rollout.events[events_before:]:
        log.warning("rollout event at step %d: %s", step, event)
    # 3. score (reward/<name>): the rewards score the model's (last) turn; an episode adds its environment's reward
    fault("score", step)
    t0 = time.perf_counter()
    samples = [Sample(prompt=text, completion=model_turn(parts, p, c), reference=p.reference,
                      completion_ids=c.token_ids, raw_prompt=p.as_data)
               for p, text, group in zip(prompts, texts, completions) for c in group]
    # A user's reward (rewards by import path) is called once per prompt's group, with the run's progress.
    result = parts.rewards.score(samples, [len(g) for g in completions], TrainingProgress(step - 1, cfg.train.steps))
    flat = [c for group in completions for c in group]
    totals = [t + getattr(c, "env_reward", 0.0) for t, c in zip(result.totals, flat)]
    for line in result.errors:
        log.error("step %d: %s", step, line)
    return Drawn(prompts, prompt_ids, texts, completions, [result], totals,
                 {"generate": t_gen, "score": time.perf_counter() - t0}, len(parts.rollout.events) - events_before)


def draw_metrics(drawn: Drawn) -> dict[str, float]:
    """Reward and rollout figures over every sample drawn this step (all draws, trained on or not)."""
    per_name: dict[str, list[float]] = {}
    logged: dict[str, list[float]] = {}
    for result in drawn.rewards:
        for name, values in result.per_name.items():
            per_name.setdefault(name, []).extend(values)
        for key, value in result.metrics.items():
            logged.setdefault(key, []).append(value)
    # The judge's counters (judge/requests, judge/seconds...) add up over draws; a user reward's log_metric is a mean.
    reported = {key: float(np.sum(v) if key.startswith("judge/") else np.mean(v)) for key, v in logged.items()}
    failures: dict[str, int] = {}
    for result in drawn.rewards:
        for kind, count in result.failures.items():
            failures[kind] = failures.get(kind, 0) + count
    flat = [c for group in drawn.completions for c in group]
    return {
        "reward/total": float(np.mean(drawn.totals)),
        "reward/total_std": float(np.std(drawn.totals)),
        **{f"reward/{name}": float(np.nanmean(v)) for name, v in per_name.items() if not np.isnan(v).all()},
        **{(key if key.startswith("judge/") else f"reward/{key}"): value for key, value in reported.items()},
        "reward/errors": sum(len(r.errors) for r in drawn.rewards),
        **{f"reward/errors/{kind}": count for kind, count in failures.items()},
        **rollout_metrics(flat, drawn.seconds["generate"]),
        "rollout/restarts": drawn.restarts,
        "timing/generate": drawn.seconds["generate"],
        "timing/score": drawn.seconds["score"],
    }


def model_turn(parts: Parts, prompt: Prompt, completion: Completion) -> str:
    """What the rewards read: the assistant's turn as a reader sees it (an episode's every turn starts with the
    assistant prefix)."""
    if isinstance(completion, EpisodeSample):
        return parts.renderer.assistant_prefix + completion.text
    return parts.renderer.turn(prompt, completion.text)


def rollout_metrics(flat: list[Completion], t_gen: float) -> dict[str, float]:
    """Lengths and speed of the model's own tokens (an episode's environment tokens are not generated)."""
    lengths = np.array([sum(c.mask) if isinstance(c, EpisodeSample) else len(c.token_ids) for c in flat])
    out = {
        "rollout/completion_len_mean": float(lengths.mean()),
        "rollout/completion_len_max": int(lengths.max()),
        "rollout/truncated_frac": float(np.mean([c.finish_reason == "length" for c in flat])),
        "rollout/tokens_per_s": float(lengths.sum() / max(t_gen, 1e-9)),
    }
    if isinstance(flat[0], EpisodeSample):
        out.update(episode_metrics(flat))  # type: ignore[arg-type]
    return out


def generate_and_score(cfg: RunConfig, parts: Parts, step: int, fault: FaultHook = NO_FAULTS) -> Rollouts:
    """Steps 1-3: sample prompts, generate n completions (or episodes) each, score them; with
    train.dynamic_sampling, draw more until the batch holds enough groups whose rewards vary
    (orchestration/dynamic_sampling.py)."""
    stream_state = parts.stream.state_dict()
    quota, dynamic = cfg.train.prompts_per_step, cfg.train.dynamic_sampling

    def draw(count: int, first: int) -> Drawn:
        return draw_groups(cfg, parts, step, count, first, fault)

    if dynamic.enabled:
        drawn, kept, extra = fill_batch(draw, quota, dynamic.max_draws, step)
    else:
        drawn, kept, extra = draw(quota, 0), list(range(quota)), {}
    batch = drawn.take(kept)
    metrics = {**draw_metrics(drawn), **extra, **parts.rollout.metrics()}  # per replica when rollout.replicas > 1
    return Rollouts(step, batch.prompts, batch.prompt_ids, batch.completions, stream_state,
                    parts.stream.state_dict(), metrics, batch.totals, batch.texts)


def to_train_batch(cfg: RunConfig, r: Rollouts) -> TrainBatch:
    """Step 4: flatten groups into the learner's batch (advantages are the learner's: its GRPO options)."""
    prompt_ids, completion_ids, engine_logprobs, group_ids, masks = [], [], [], [], []
    for g, (ids, group) in enumerate(zip(r.prompt_ids, r.completions)):
        for c in group:
            prompt_ids.append(ids)
            completion_ids.append(list(c.token_ids))
            engine_logprobs.append(list(c.logprobs))
            group_ids.append(g)
            masks.append(list(c.mask) if isinstance(c, EpisodeSample) else None)
    # The full transform the engine sampled from; eos ids only matter to min_tokens (which masks them).
    sampling = SamplingTransform.of(cfg.rollout.sampling, model_eos_ids(str(cfg.model.resolved_path)))
    return TrainBatch(
        prompt_ids=prompt_ids, completion_ids=completion_ids, engine_logprobs=engine_logprobs,
        rewards=np.asarray(r.totals, dtype=np.float32), group_ids=np.asarray(group_ids, dtype=np.int32),
        sampling=sampling, completion_mask=None if masks[0] is None else masks,  # environment tokens: 0
    )


def learner_get(ref: Any, what: str) -> Any:
    """ray.get of a learner call; a dead learner actor becomes one `LearnerDied` line instead of Ray's report."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        cause = str(exc).strip().splitlines()[0][:200]
        raise LearnerDied(f"the learner actor died during {what} ({cause})") from None
    except LearnerProcessLost as exc:  # learner.hosts > 1: Ray re-raises the group's error as this type
        cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()[-1]
        raise LearnerDied(f"a learner process died during {what} ({cause})") from None


def push_adapter(parts: Parts, version: int, fault: FaultHook = NO_FAULTS) -> float:
    """Step 6: ship the learner's LoRA tensors to the server as a new adapter version; returns the pause (s)."""
    tensors, adapter_config = learner_get(parts.learner.lora_tensors.remote(), "the LoRA export")
    fault("push", version)
    return parts.rollout.push_lora(version, tensors, adapter_config)


def log_samples(run_dir: RunDir, r: Rollouts, renderer: PromptRenderer) -> None:
    """Keep one prompt's group of completions (an episode: its transcript) per step, for people reading what the
    policy does."""
    with (run_dir.local / "samples.jsonl").open("a") as f:
        group = r.completions[0]
        row = {"step": r.step, "prompt": r.texts[0] if r.texts else renderer.text(r.prompts[0]),
               "completions": [c.text for c in group], "rewards": r.totals[: len(group)]}
        if isinstance(group[0], EpisodeSample):
            row["episodes"] = [{"transcript": c.transcript, "end": c.end, "env_reward": c.env_reward}
                               for c in group]  # type: ignore[union-attr]
        f.write(json.dumps(row) + "\n")
    run_dir.sync("samples.jsonl")


@dataclass
class InFlight:
    """A learner update submitted but not yet collected: if the run is interrupted, it is finished and saved."""

    step: int
    ref: Any  # ray.ObjectRef of Learner.step's metrics
    data_after: dict  # data position once this step's prompts are consumed
    metrics: dict  # the step's rollout metrics, logged with the learner's once it is collected


@dataclass
class LoopState:
    """What an interrupted run needs to save: the last finished step, the data position after it, its metrics."""

    step: int
    data: dict
    saved_step: int
    in_flight: InFlight | None = None
    unlogged: tuple[int, dict] | None = None  # a learned step whose metrics row is not written yet
    where: tuple[str, int] = ("start", 0)  # (phase, step) the loop is in, for the line an interrupt prints

    def learned(self, step: int, data_after: dict, metrics: dict) -> None:
        """Step `step`'s update is applied: it is now the step a checkpoint records."""
        self.step, self.data, self.in_flight, self.unlogged = step, data_after, None, (step, metrics)


def collect(state: LoopState) -> dict:
    """Wait for the in-flight update and make it the last finished step; returns its metrics row so far."""
    flight = state.in_flight
    metrics = {**flight.metrics, **learner_get(flight.ref, f"the update of step {flight.step}")}
    state.learned(flight.step, flight.data_after, metrics)
    return metrics


def save_checkpoint(parts: Parts, state: LoopState, fault: FaultHook = NO_FAULTS) -> None:
    """Checkpoint the learner (LoRA, optimizer, RNG) with the step and the data position after it.

    An update already started is finished first and its metrics row written: the learner has applied it, so
    saving it under the previous step would replay data, and dropping its row would leave a hole in metrics.jsonl.
    """
    if state.in_flight is not None:
        collect(state)
    if state.unlogged is not None:
        parts.metrics.log(*state.unlogged)
        state.unlogged = None
    state.where = ("save", state.step)
    ref = parts.learner.save.remote(state.step, {"data": state.data})
    fault("save", state.step)
    learner_get(ref, f"the checkpoint of step {state.step}")
    state.saved_step = state.step
    parts.run_dir.note_saved(state.step)


def generate_ahead(cfg: RunConfig, parts: Parts, pending: deque, step: int, fault: FaultHook) -> None:
    """Async: generate the batches of steps step+1 .. step+max_staleness not generated yet (adapter step-1)."""
    nxt = step + 1 + len(pending)
    while len(pending) < cfg.train.max_staleness and nxt <= cfg.train.steps:
        pending.append(generate_and_score(cfg, parts, nxt, fault))
        nxt += 1


def train_loop(cfg: RunConfig, parts: Parts, state: LoopState, fault: FaultHook = NO_FAULTS) -> None:
    """Run steps state.step+1 .. cfg.train.steps. The adapter on the server is version `state.step` on entry."""
    version = state.step  # one learner update per step, so the policy version is the step count
    first_step = state.step + 1
    pending: deque[Rollouts] = deque()  # async: batches generated ahead, oldest first
    for step in range(state.step + 1, cfg.train.steps + 1):
        t_step = time.perf_counter()
        state.where = ("generate", step)
        rollouts = pending.popleft() if pending else generate_and_score(cfg, parts, step, fault)
        staleness = [version - (c.adapter_version or 0) for g in rollouts.completions for c in g]
        rollouts.metrics.update({"async/staleness_mean": float(np.mean(staleness)),
                                 "async/staleness_max": max(staleness)})
        # 5. learner.step (timing/learn); in async mode the next generations overlap it
        state.where = ("learn", step)
        t0 = time.perf_counter()
        learn_ref = parts.learner.step.remote(to_train_batch(cfg, rollouts))
        state.in_flight = InFlight(step, learn_ref, rollouts.stream_after, rollouts.metrics)
        fault("learn", step)
        if cfg.train.mode == "async":
            state.where = ("generate", step + 1)
            generate_ahead(cfg, parts, pending, step, fault)
            state.where = ("learn", step)
        metrics = collect(state)
        check_engine_agreement(cfg, step - first_step + 1, metrics)  # stop before training on a wrong model
        t_learn = time.perf_counter() - t0
        # 6. export_lora + load_lora (timing/sync)
        state.where = ("push", step)
        t0 = time.perf_counter()
        events_before = len(parts.rollout.events)
        pause = push_adapter(parts, step, fault)
        version = step
        t_sync = time.perf_counter() - t0
        # rollout/restarts: the step's generation counted its own; a server that died in the push counts here.
        metrics["rollout/restarts"] = metrics.get("rollout/restarts", 0) + len(parts.rollout.events) - events_before
        # 7. log, maybe save
        metrics.update({"rollout/adapter_version": version, "timing/learn": t_learn, "timing/sync": t_sync,
                        "timing/push_pause": pause, "timing/step": time.perf_counter() - t_step})
        metrics.update(judge_step_metrics(metrics))
        if pending:
            metrics["timing/generate_overlapped"] = sum(p.metrics["timing/generate"] for p in pending)
        parts.metrics.log(step, metrics)  # `metrics` is state.unlogged's row, now complete
        state.unlogged = None
        log_samples(parts.run_dir, rollouts, parts.renderer)
        maybe_eval(cfg, parts, step)
        if step == cfg.train.steps or (cfg.train.save_every and step % cfg.train.save_every == 0):
            save_checkpoint(parts, state, fault)
            log.info("checkpoint saved at step %d", step)
        state.where = ("between", step)
        fault("between", step)
