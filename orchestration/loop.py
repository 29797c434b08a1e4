"""The GRPO training loop, top-down: `train_loop` first, each numbered step one call below it.

What GRPO means here: each step draws `train.prompts_per_step` prompts, the engine samples `rollout.sampling.n`
completions of each with the current LoRA adapter, the rewards score them, and the learner turns each group's
rewards into group-relative advantages and takes a clipped policy-gradient step on the LoRA weights
(importance-corrected against the engine's own logprobs). The new adapter is served to the engines under the
version's name (`policy-v{step}`) before the next generation, whose requests name it, so every sample records which
policy made it.

The learner is driven through its handle's primitives, the Tinker API's: forward_backward(batch, "grpo") and
optim_step() for each update of the step (orchestration/update.py turns the rewards into advantages and the
step into updates), save_for_sampler(); the engines through the rollout handle's generate, serve and unserve. Neither handle
says how many processes or replicas stand behind it, and this module imports no Ray.

With an `environment:`, a sample is a multi-turn episode instead of one completion (tasks/episodes.py), of the
same type: the learner trains on the model's tokens only (the completion's mask). The loop is otherwise the same.

sync:  generate(k) -> learn(k) -> push(k) -> generate(k+1) ...
async: while learn(k) runs in the learner, the driver generates ahead up to step k + train.max_staleness with the
       adapter it has (version k-1), so a sample is at most max_staleness versions behind its update.

With `train.dynamic_sampling` a step draws more prompts until its batch holds enough groups whose rewards vary
(orchestration/dynamic_sampling.py). Each request's seed comes from (train.seed, step, prompt index), the index
counting over all of a step's draws, so a resumed run draws the same samples as an uninterrupted one. The phases
(generate, refill, score, learn, push, eval, save, between; orchestration/phases.py) are where a test's fault
lands.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np

from common.lora_adapter import version_name
from learner.adapter_api import POLICY
from learner.sampling import SamplingTransform, model_eos_ids
from orchestration.config.schema import RunConfig
from orchestration.console import CONSOLE
from orchestration.dynamic_sampling import Drawn, fill_batch
from orchestration.faults import NO_FAULTS, FaultHook
from orchestration.evaluation import maybe_eval
from orchestration.judge import judge_step_metrics
from orchestration.phases import Phase, Phases
from orchestration.problem import run_limits
from orchestration.state import InFlight, LoopState, Parts, StepBatch
from orchestration.step_metrics import draw_metrics, log_samples
from orchestration.update import ScoredSamples, check_engine_agreement, plan_update, update_calls, update_metrics
from rewards.types import Sample, TrainingProgress
from rollout.capabilities import takes_request_seeds
from tasks.samples import sample_groups

log = logging.getLogger(__name__)


def train_loop(cfg: RunConfig, parts: Parts, state: LoopState, fault: FaultHook = NO_FAULTS) -> None:
    """Run steps state.step+1 .. cfg.train.steps. The engines serve `policy_name(state.step)` on entry."""
    phases = Phases(state, fault)
    first_step = state.step + 1
    ahead: deque[StepBatch] = deque()  # async: batches generated ahead, oldest first
    for step in range(first_step, cfg.train.steps + 1):
        t_step = time.perf_counter()
        # 1-3. sample prompts, generate, score (timing/generate, reward/<name>); async: generated during learn(k-1)
        batch = ahead.popleft() if ahead else generate_and_score(cfg, parts, step, phases, state.step)
        # 4-5. advantages, forward_backward + optim_step (timing/learn); async: the next steps generate meanwhile
        with phases.enter("learn", step) as learn:
            submit_update(cfg, parts, state, batch)
            learn.fault()
            if cfg.train.mode == "async":
                generate_ahead(cfg, parts, ahead, step, phases, state.step)
            collect(state)
        check_engine_agreement(cfg, step - first_step + 1, state.row)  # stop before training on a wrong model
        # 6. save_for_sampler + serve (timing/sync)
        with phases.enter("push", step) as push:
            push_adapter(parts, push, state)
        # 7. log, maybe eval, maybe save
        state.add(step_timings(learn, push, t_step, ahead))
        state.add(judge_step_metrics(state.row))
        state.write_row(parts.metrics)
        log_samples(parts.run_dir, batch)
        with phases.enter("eval", step) as evaluation:  # its fault: once the eval's requests are out
            maybe_eval(cfg, parts, step, on_sent=evaluation.fault, adapter=policy_name(step))
        if step == cfg.train.steps or (cfg.train.save_every and step % cfg.train.save_every == 0):
            save_checkpoint(parts, state, phases)
            log.info("checkpoint saved at step %d", step, extra=CONSOLE)
        with phases.enter("between", step) as between:
            between.fault()


def policy_name(step: int) -> str | None:
    """The served name of the policy after `step` updates ("policy-v{step}"); None at step 0: the base model."""
    return version_name(POLICY, step) if step else None


# ---- 1-3: draw, generate, score ---------------------------------------------------------------------------------
def generate_and_score(cfg: RunConfig, parts: Parts, step: int, phases: Phases, policy_step: int) -> StepBatch:
    """Sample prompts, generate n completions (or episodes) each from the policy after `policy_step` updates, score
    them; with train.dynamic_sampling, draw more until the batch holds enough groups whose rewards vary
    (orchestration/dynamic_sampling.py)."""
    stream_state = parts.stream.state_dict()
    quota, dynamic = cfg.train.prompts_per_step, cfg.train.dynamic_sampling

    def draw(count: int, first: int) -> Drawn:
        return draw_groups(cfg, parts, step, count, first, phases, policy_name(policy_step))

    if dynamic.enabled:
        drawn, kept, extra = fill_batch(draw, quota, dynamic.max_draws, step)
    else:
        drawn, kept, extra = draw(quota, 0), list(range(quota)), {}
    picked = drawn.take(kept)
    metrics = {**draw_metrics(drawn), **extra, **parts.rollout.metrics()}  # per replica when rollout.replicas > 1
    return StepBatch(step, picked.prompts, picked.prompt_ids, picked.completions, stream_state,
                     parts.stream.state_dict(), metrics, picked.totals, picked.texts, policy_step)


def draw_groups(cfg: RunConfig, parts: Parts, step: int, count: int, first: int, phases: Phases,
                policy: str | None) -> Drawn:
    """Draw `count` prompts, generate n completions (or episodes) each from the served adapter `policy` (request
    seeds from prompt index `first`), score them. A refill draw's generation is the phase "refill"."""
    prompts = parts.stream.next_batch(count)
    events_before = len(parts.rollout.events)
    with phases.enter("generate" if first == 0 else "refill", step) as gen:  # its fault: once requests are out
        drawn = sample_groups(parts.rollout, parts.renderer, prompts, cfg.rollout.sampling,
                              environment=parts.environment, limits=run_limits(cfg),
                              seeds=request_seeds(cfg, step, len(prompts), first), on_sent=gen.fault,
                              concurrency=cfg.rollout.client.max_concurrency, adapter=policy)
    prompt_ids, texts, completions, answers = drawn.prompt_ids, drawn.texts, drawn.completions, drawn.answers
    for event in parts.rollout.events[events_before:]:
        log.warning("rollout event at step %d: %s", step, event)
    # The rewards score the model's (last) turn; an episode adds its environment's reward.
    with phases.enter("score", step) as score:
        score.fault()
        samples = [Sample(prompt=text, completion=answer, reference=p.reference, completion_ids=c.token_ids,
                          raw_prompt=p.as_data)
                   for p, text, group, group_answers in zip(prompts, texts, completions, answers)
                   for c, answer in zip(group, group_answers)]
        # A user's reward (rewards by import path) is called once per prompt's group, with the run's progress.
        result = parts.rewards.score(samples, [len(g) for g in completions],
                                     TrainingProgress(step - 1, cfg.train.steps))
    totals = [t + c.env_reward for t, c in zip(result.totals, (c for group in completions for c in group))]
    for line in result.errors:
        log.error("step %d: %s", step, line)
    return Drawn(prompts, prompt_ids, texts, completions, [result], totals,
                 {"generate": gen.seconds, "score": score.seconds}, len(parts.rollout.events) - events_before)


def request_seeds(cfg: RunConfig, step: int, count: int, first: int = 0) -> list[int] | None:
    """Per-request seeds from (train.seed, step, prompt index) for indices first .. first+count-1 (a dynamic-sampling
    refill continues the step's index); None for an engine that cannot take them."""
    if not takes_request_seeds(cfg.rollout.backend):  # rollout/capabilities.py: vllm-tpu rejects a per-request seed
        return None
    return [int(np.random.SeedSequence([cfg.train.seed, step, i]).generate_state(1)[0] >> 1)
            for i in range(first, first + count)]


def generate_ahead(cfg: RunConfig, parts: Parts, ahead: deque, step: int, phases: Phases, policy_step: int) -> None:
    """Async: generate the batches of steps step+1 .. step+max_staleness not generated yet, from the policy the
    engines serve (after `policy_step` = step-1 updates)."""
    nxt = step + 1 + len(ahead)
    while len(ahead) < cfg.train.max_staleness and nxt <= cfg.train.steps:
        ahead.append(generate_and_score(cfg, parts, nxt, phases, policy_step))
        nxt += 1


# ---- 4-5: the learner's batch and its update ----------------------------------------------------------------------
def scored_samples(cfg: RunConfig, batch: StepBatch) -> ScoredSamples:
    """Flatten the step's groups into samples with their rewards (orchestration/update.py makes the update)."""
    prompt_ids, completion_ids, engine_logprobs, group_ids, masks = [], [], [], [], []
    for g, (ids, group) in enumerate(zip(batch.prompt_ids, batch.completions)):
        for c in group:
            prompt_ids.append(ids)
            completion_ids.append(list(c.token_ids))
            engine_logprobs.append(list(c.logprobs))
            group_ids.append(g)
            masks.append(c.mask)
    # The full transform the engine sampled from; eos ids only matter to min_tokens (which masks them).
    sampling = SamplingTransform.of(cfg.rollout.sampling, model_eos_ids(str(cfg.model.resolved_path)))
    return ScoredSamples(
        prompt_ids=prompt_ids, completion_ids=completion_ids, engine_logprobs=engine_logprobs,
        rewards=np.asarray(batch.totals, dtype=np.float32), group_ids=np.asarray(group_ids, dtype=np.int32),
        sampling=sampling,
        completion_mask=None if all(m is None for m in masks) else masks,  # environment tokens: 0
    )


def submit_update(cfg: RunConfig, parts: Parts, state: LoopState, batch: StepBatch) -> None:
    """The step's advantages, then its forward_backward + optim_step calls, all in flight in the learner; the
    batch's staleness noted."""
    # one learner update per step, so the policy's version is the last learned step
    staleness = state.step - batch.policy_step
    batch.metrics.update({"async/staleness_mean": float(staleness), "async/staleness_max": staleness})
    plan = plan_update(cfg.learner.grpo, scored_samples(cfg, batch))
    state.in_flight = InFlight(batch.step, plan, update_calls(parts.learner, plan), batch.stream_after,
                               batch.metrics)


def collect(state: LoopState) -> None:
    """Wait for the in-flight update and make it the last finished step, its metrics row open."""
    flight = state.in_flight
    answers = [(fb.result(), opt.result()) for fb, opt in flight.calls]
    state.learned(flight.step, flight.data_after, {**flight.metrics, **update_metrics(flight.plan, answers)})


# ---- 6-7: push, log, save -----------------------------------------------------------------------------------------
def push_adapter(parts: Parts, push: Phase, state: LoopState) -> None:
    """Serve the learner's LoRA to the engines as `policy_name(push.step)` and take the previous version off; the
    push's figures join the row."""
    events_before = len(parts.rollout.events)
    adapter = parts.learner.save_for_sampler(name=policy_name(push.step))
    push.fault()
    t0 = time.perf_counter()
    parts.rollout.serve(adapter)
    if (previous := policy_name(push.step - 1)) is not None:
        parts.rollout.unserve(previous)
    pause = time.perf_counter() - t0
    # rollout/restarts: the step's generation counted its own; a server that died in the push counts here.
    restarts = state.row.get("rollout/restarts", 0) + len(parts.rollout.events) - events_before
    state.add({"timing/push_pause": pause, "rollout/adapter_version": push.step, "rollout/restarts": restarts})


def step_timings(learn: Phase, push: Phase, t_step: float, ahead: deque) -> dict[str, float]:
    """The step's phase times (and, async, the generation that overlapped its update)."""
    out = {"timing/learn": learn.seconds, "timing/sync": push.seconds, "timing/step": time.perf_counter() - t_step}
    if ahead:
        out["timing/generate_overlapped"] = sum(b.metrics["timing/generate"] for b in ahead)
    return out


def save_checkpoint(parts: Parts, state: LoopState, phases: Phases | None = None) -> None:
    """Checkpoint the learner (LoRA, optimizer, RNG) with the step and the data position after it.

    An update already started is finished first and its metrics row written: the learner has applied it, so
    saving it under the previous step would replay data, and dropping its row would leave a hole in metrics.jsonl.
    """
    phases = phases or Phases(state)
    if state.in_flight is not None:
        collect(state)
    state.write_row(parts.metrics)
    with phases.enter("save", state.step) as save:
        pending = parts.learner.save(state.step, {"data": state.data})
        save.fault()
        pending.result()
    state.saved_step = state.step
    parts.run_dir.note_saved(state.step)
