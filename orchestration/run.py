"""A training run from start to finish: connect, start the actors, restore, loop, export, plot, tear down.

Whatever happens in the loop, the engine server is stopped (it runs in its own process group, which Ray would
otherwise leave behind) and the last finished step is checkpointed, so an interrupted run loses nothing done. An
interrupt (SIGINT/SIGTERM, `orchestration.signals`) or a dead learner ends the run with one line that says which
step is saved and how to continue; the caller turns it into a non-zero exit code.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import ray

from orchestration import cluster, signals
from orchestration.config import RunConfig
from tasks import PromptStream, setup_dataset
from orchestration.engine_check import EngineMismatchError
from orchestration.faults import FaultHook
from orchestration.judge import setup_judge
from orchestration.loop import LearnerDied, LoopState, Parts, push_adapter, save_checkpoint, train_loop
from orchestration.metrics import read_metrics, setup_metrics
from orchestration.plots import write_plots
from tasks.render import PromptRenderer
from rewards.registry import setup_rewards

log = logging.getLogger(__name__)


def restore(cfg: RunConfig, parts: Parts, run_dir: Path) -> LoopState:
    """Resume from the learner's last checkpoint: step, optimizer and data position; push that adapter first."""
    step, extra = ray.get(parts.learner.restore.remote())
    drop_rows_after(run_dir, step)
    parts.metrics = setup_metrics(cfg, run_dir, step)
    if step == 0:
        return LoopState(step=0, data=parts.stream.state_dict(), saved_step=0)
    parts.stream.load_state_dict(extra["data"])
    # The server is fresh: it must serve the restored policy before the first generation.
    push_adapter(parts, step)
    log.info("resumed at step %d (adapter version %d pushed)", step, step)
    return LoopState(step=step, data=extra["data"], saved_step=step)


def drop_rows_after(run_dir: Path, step: int) -> None:
    """Forget the rows of steps after the checkpoint (written before a crash that could not save): they are redone."""
    for path in (run_dir / "metrics.jsonl", run_dir / "samples.jsonl"):
        if path.exists():
            lines = path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if json.loads(line)["step"] <= step]
            if len(kept) < len(lines):
                log.warning("%s: dropping %d rows after checkpoint step %d (redone now)", path.name,
                            len(lines) - len(kept), step)
                path.write_text("".join(kept))


def finish(cfg: RunConfig, parts: Parts, run_dir: Path) -> None:
    """Export the final adapter, draw the plots, write a short summary."""
    adapter_dir = ray.get(parts.learner.export_lora.remote(run_dir / "adapter"))
    rows = read_metrics(run_dir)
    if cfg.logging.plots and rows:
        write_plots(rows, run_dir / "plots")
    summary = summarize(rows)
    summary["adapter"] = str(adapter_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    log.info("summary: %s", json.dumps(summary))
    log.info("serve the trained adapter: python -m orchestration.serve %s", run_dir)


def summarize(rows: list[dict]) -> dict:
    """Mean reward over the first and last few steps: the headline of a run."""
    if not rows:
        return {"steps": 0}
    k = max(1, min(5, len(rows) // 3))
    timed = [r["timing/step"] for r in rows if "timing/step" in r]  # a step stopped before its push has none
    first = [r["reward/total"] for r in rows[:k]]
    last = [r["reward/total"] for r in rows[-k:]]
    return {"steps": rows[-1]["step"], f"reward_first_{k}": sum(first) / k, f"reward_last_{k}": sum(last) / k,
            "mean_step_s": float(np.mean(timed)) if timed else None}


def stop_line(exc: BaseException, where: tuple[str, int] | None, state: LoopState | None, run_dir: Path) -> str:
    """The one line an interrupted or broken run ends with."""
    what = f"interrupted by {exc.name}" if isinstance(exc, signals.Interrupted) else str(exc)
    if state is None or where is None:
        return f"run stopped before its first step ({what}); nothing to save"
    return (f"run stopped at phase {where[0]} of step {where[1]} ({what}); checkpoint saved at step "
            f"{state.saved_step}; continue with `python -m orchestration.train --resume {run_dir}`")


def save_on_stop(parts: Parts, state: LoopState) -> None:
    """Save the last finished step (finishing an update the learner has started); say why if it cannot."""
    if state.step == state.saved_step and state.in_flight is None and state.unlogged is None:
        return
    try:
        save_checkpoint(parts, state)
    except (LearnerDied, KeyboardInterrupt) as exc:  # a second Ctrl-C or a dead learner: keep the older checkpoint
        log.error("could not save step %d (%s); the checkpoint stays at step %d", state.step, exc, state.saved_step)


def run(cfg: RunConfig, run_dir: Path) -> None:
    fault = FaultHook.from_env()  # tests only; a bad AHA_FAULT fails here, before anything is started
    prompts = setup_dataset(cfg.data, "train")  # a data config error (DatasetTooSmall) too: in seconds, not minutes
    started_cluster = False
    rollout = judge_engine = None
    parts = state = None
    try:
        started_cluster = cluster.connect(cfg)
        signals.install()  # ray.init replaced the SIGTERM handler with sys.exit
        learner = cluster.start_learner(cfg, (run_dir / "checkpoints").resolve())
        rollout = cluster.start_rollout(cfg)
        stream = PromptStream(prompts, cfg.train.prompts_per_step, cfg.data.seed)
        renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
        rewards = setup_rewards(cfg.rewards)
        judge_engine = setup_judge(cfg, rewards, rollout)  # a judge term's engine: the training one or its own
        parts = Parts(rollout, learner, rewards, stream, renderer, None)  # type: ignore[arg-type]
        fault.parts = parts
        state = restore(cfg, parts, run_dir)
        train_loop(cfg, parts, run_dir, state, fault)
        finish(cfg, parts, run_dir)
    except (KeyboardInterrupt, LearnerDied) as caught:
        # A signal taken inside a Ray call comes back as a plain KeyboardInterrupt (orchestration/signals.py).
        exc = signals.interrupted(caught) if isinstance(caught, KeyboardInterrupt) else caught
        where = state.where if state is not None else None
        if parts is not None and state is not None and isinstance(exc, signals.Interrupted):
            save_on_stop(parts, state)
        log.error("%s", stop_line(exc, where, state, run_dir))
        raise exc from None
    except EngineMismatchError:
        raise  # its update was made against another model than the engine's: keep nothing (no row, no checkpoint)
    except BaseException:
        if parts is not None and state is not None:
            save_on_stop(parts, state)
        raise
    finally:
        if parts is not None and parts.metrics is not None:
            parts.metrics.close()
        for engine in (rollout, judge_engine):
            if engine is not None:
                engine.stop()
        if started_cluster:
            ray.shutdown()
