"""A training run from start to finish: connect, start the actors, restore, loop, export, plot, tear down.

Whatever happens in the loop, the engine server is stopped (it runs in its own process group, which Ray would
otherwise leave behind) and the last finished step is checkpointed, so an interrupted run loses nothing done. An
interrupt (SIGINT/SIGTERM, `orchestration.signals`) or a dead learner ends the run with one line that says which
step is saved and how to continue; the caller turns it into a non-zero exit code.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from common import peft_adapter
from learner.handle import LearnerDied, LearnerHandle
from orchestration import signals
from orchestration.cluster import launch
from orchestration.cluster.process_tree import already_running, ending_what_it_started
from orchestration.config.schema import RunConfig
from orchestration.console import CONSOLE, LOG_FILE, RAY_LOGS, link_ray_logs
from tasks import PromptStream
from orchestration.update import EngineMismatchError
from orchestration.faults import FaultHook
from orchestration.judge import setup_judge
from orchestration.loop import policy_name, save_checkpoint, train_loop
from orchestration.metrics import read_metrics, setup_metrics
from orchestration.run_dir import CHECKPOINTS, RunDir, RunDirError, check_shared
from orchestration.state import LoopState, Parts
from orchestration.report.plots import write_plots
from tasks.render import PromptRenderer
from orchestration.problem import run_environment, run_rewards, run_rows

log = logging.getLogger(__name__)
T = TypeVar("T")


def restore_learner(learner: LearnerHandle, run_dir: RunDir) -> tuple[int, dict]:
    """The learner's last checkpoint: (step, extra), (0, {}) when it has none; refused when the run saved a later
    one that the learner's host cannot see (a resume there would start over and drop every row)."""
    step, extra = learner.restore()
    expected = run_dir.expected_checkpoint()
    if expected is not None and step < expected:
        host = learner.node()
        found = f"step {step}" if step else "no checkpoint"
        raise RunDirError(f"resume: this run saved checkpoint step {expected} under "
                          f"{run_dir.path(CHECKPOINTS)}, but the learner on {host} found {found} there (that "
                          "path is not on its host); put the run dir on storage every host reads (gs://...) or a "
                          "mount every node shares; nothing was changed")
    return step, extra


def in_background(fn: Callable[..., T], *args: Any) -> Future[T]:
    """fn(*args) on a daemon thread: its result (or exception) from `.result()`; a process that ends before it is
    done does not wait for it (a ThreadPoolExecutor's threads would hold the exit until fn returned)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001  (handed to whoever waits on the future)
            future.set_exception(exc)

    threading.Thread(target=run, name=f"in-background-{getattr(fn, '__name__', 'fn')}", daemon=True).start()
    return future


def drop_rows_after(run_dir: RunDir, step: int) -> None:
    """Forget the rows of steps after the checkpoint (written before a crash that could not save): they are redone."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        path = run_dir.local / name
        if path.exists():
            lines = path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if json.loads(line)["step"] <= step]
            if len(kept) < len(lines):
                log.warning("%s: dropping %d rows after checkpoint step %d (redone now)", name,
                            len(lines) - len(kept), step)
                path.write_text("".join(kept))
                run_dir.sync(name)


def loop_state(parts: Parts, step: int, extra: dict) -> LoopState:
    """Where the loop starts: after the restored step, with the data stream where that step left it."""
    if step == 0:
        return LoopState(step=0, data=parts.stream.state_dict(), saved_step=0)
    parts.stream.load_state_dict(extra["data"])
    return LoopState(step=step, data=extra["data"], saved_step=step)


def serve_restored_policy(parts: Parts, step: int) -> dict | None:
    """A fresh engine serves the base model: serve the restored adapter (as `policy_name(step)`) before the first
    generation. Returns what was restored (the step and the LoRA's checksum, which summary.json keeps), None for a
    new run."""
    if step == 0:
        return None
    adapter = parts.learner.save_for_sampler(name=policy_name(step))
    restored = {"step": step, "lora_sha256": peft_adapter.checksum(adapter.tensors)}
    parts.rollout.serve(adapter)
    log.info("resumed at step %d (adapter %s served; LoRA sha256 %s)", step, adapter.name, restored["lora_sha256"],
             extra=CONSOLE)
    return restored


def finish(cfg: RunConfig, parts: Parts, placement: dict, resumed: dict | None) -> None:
    """Export the final adapter (to the run dir, where the driver and a user can read it), draw the plots, write a
    short summary (with what a resume restored)."""
    run_dir = parts.run_dir
    adapter_dir = parts.learner.export(run_dir.path("adapter"))
    rows = read_metrics(run_dir.local)
    if cfg.logging.plots and rows:
        write_plots(rows, run_dir.local / "plots")
    summary = summarize(rows)
    summary["adapter"] = str(adapter_dir)
    summary["placement"] = placement
    if resumed is not None:
        summary["resumed"] = resumed
    (run_dir.local / "summary.json").write_text(json.dumps(summary, indent=2))
    log.info("summary: %s", json.dumps(summary))
    log.info("logs: %s (this process), %s/ (Ray: learner, engines)", run_dir.local / LOG_FILE,
             run_dir.local / RAY_LOGS, extra=CONSOLE)
    log.info("serve the trained adapter: aha serve %s", run_dir, extra=CONSOLE)


def placement_of(parts: Parts) -> dict:
    """Which node each part runs on: the driver's, the learner's (process 0), the engines' URLs."""
    urls = parts.rollout.base_urls
    where = {"driver": launch.driver_address(), "learner": parts.learner.node(), "engines": urls}
    log.info("placement: driver on %s, learner on %s, engines at %s", where["driver"], where["learner"], urls)
    return where


def summarize(rows: list[dict]) -> dict:
    """Mean reward over the first and last few steps, the mean step time and the engine restarts of the whole run
    (resumed parts included): the headline of a run."""
    if not rows:
        return {"steps": 0}
    k = max(1, min(5, len(rows) // 3))
    timed = [r["timing/step"] for r in rows if "timing/step" in r]  # a step stopped before its push has none
    first = [r["reward/total"] for r in rows[:k]]
    last = [r["reward/total"] for r in rows[-k:]]
    return {"steps": rows[-1]["step"], f"reward_first_{k}": sum(first) / k, f"reward_last_{k}": sum(last) / k,
            "mean_step_s": float(np.mean(timed)) if timed else None,
            "engine_restarts": int(sum(r.get("rollout/restarts", 0) for r in rows))}


def stop_line(exc: BaseException, where: tuple[str, int] | None, state: LoopState | None, run_dir: RunDir) -> str:
    """The one line an interrupted or broken run ends with."""
    what = f"interrupted by {exc.name}" if isinstance(exc, signals.Interrupted) else str(exc)
    if state is None or where is None:
        return f"run stopped before its first step ({what}); nothing to save"
    return (f"run stopped at phase {where[0]} of step {where[1]} ({what}); checkpoint saved at step "
            f"{state.saved_step}; continue with `python -m orchestration.cli.train --resume {run_dir}`")


def save_on_stop(parts: Parts, state: LoopState) -> None:
    """Save the last finished step (finishing an update the learner has started); say why if it cannot."""
    if state.step == state.saved_step and state.in_flight is None and state.row is None:
        return
    try:
        save_checkpoint(parts, state)
    except (LearnerDied, KeyboardInterrupt) as exc:  # a second Ctrl-C or a dead learner: keep the older checkpoint
        log.error("could not save step %d (%s); the checkpoint stays at step %d", state.step, exc, state.saved_step)


@contextmanager
def started_parts(cfg: RunConfig, run_dir: RunDir, problem: tuple, verbose: bool) -> Iterator[tuple[Parts, int, dict]]:
    """Start the run's parts in order and yield them whole, with the learner's restored (step, extra); on the way out
    stop whatever started (what a part's stop leaves behind is ended before this returns). `problem`: the run's
    (environment, prompt rows, rewards), made before anything starts so their errors come in seconds."""
    environment, prompts, rewards = problem
    spare = already_running()  # before the first part starts: whatever else runs below this process is not ours
    metrics = rollout = judge_engine = None
    started_cluster = False
    try:
        started_cluster = launch.connect(cfg, verbose)
        link_ray_logs(run_dir.local)
        signals.install()  # ray.init replaced the SIGTERM handler with sys.exit
        check_shared(run_dir, cfg.train.run_dir_shared, launch.alive_nodes())
        learner = launch.start_learner(cfg, run_dir.path(CHECKPOINTS))
        # The engines start while the learner loads its model and restores (on a TPU host each loads weights and
        # compiles for minutes). A resume that cannot see its checkpoint still fails in seconds: nothing waits for
        # the engines being started, whose actors end with this driver (or with the cluster it started).
        engines_starting = in_background(launch.start_rollout, cfg)
        stream = PromptStream(prompts, cfg.train.prompts_per_step, cfg.data.seed)
        renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
        # Restored before any row is touched: a resume that cannot see its checkpoint fails with its rows intact.
        step, extra = restore_learner(learner, run_dir)
        drop_rows_after(run_dir, step)
        metrics = setup_metrics(cfg, run_dir, step)
        rollout = engines_starting.result()
        judge_engine = setup_judge(cfg, rewards, rollout)  # a judge term's engine: the training one or its own
        yield Parts(rollout, learner, rewards, stream, renderer, metrics, run_dir, environment), step, extra
    finally:
        with ending_what_it_started(spare):
            if metrics is not None:
                metrics.close()
            for engine in (rollout, judge_engine):
                if engine is not None:
                    engine.stop()
            rewards.close()
            run_dir.sync_all()
            if started_cluster:
                launch.disconnect()


def run(cfg: RunConfig, run_dir: RunDir, verbose: bool = True) -> None:
    """The whole run; not `verbose`, the Ray workers' output stays out of the console (orchestration/console.py)."""
    fault = FaultHook.from_env()  # tests only; a bad AHA_FAULT fails here, before anything is started
    environment = run_environment(cfg)  # a user's environment that cannot be imported fails here, in seconds
    prompts = run_rows(cfg, environment, "train")  # a data config error (DataError) too: in seconds, not minutes
    rewards = run_rewards(cfg)  # a reward by import path that does not import, too
    state = stopped_at = None  # stopped_at: where the loop was when it stopped (before saving moved it to "save")
    try:
        with started_parts(cfg, run_dir, (environment, prompts, rewards), verbose) as (parts, step, extra):
            fault.parts = parts
            placement = placement_of(parts)
            resumed = serve_restored_policy(parts, step)
            state = loop_state(parts, step, extra)
            try:
                train_loop(cfg, parts, state, fault)
                finish(cfg, parts, placement, resumed)
            except (EngineMismatchError, LearnerDied):
                raise  # a mismatch: its update was made against another model than the engine's, keep nothing;
                # a dead learner: nothing can save
            except BaseException:  # an interrupt (a signal taken inside a Ray call is a plain KeyboardInterrupt) or
                stopped_at = state.where  # a failure: the last finished step is saved while the parts still run
                save_on_stop(parts, state)
                raise
    except (KeyboardInterrupt, LearnerDied) as caught:
        exc = signals.interrupted(caught) if isinstance(caught, KeyboardInterrupt) else caught
        where = stopped_at or (state.where if state is not None else None)
        log.error("%s", stop_line(exc, where, state, run_dir))
        raise exc from None
