"""A training run from start to finish: connect, start the actors, restore, loop, export, plot, tear down.

Whatever happens in the loop, the engine server is stopped (it runs in its own process group, which Ray would
otherwise leave behind) and the last finished step is checkpointed, so an interrupted run loses nothing done.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import ray

from orchestration import cluster
from orchestration.config import RunConfig
from orchestration.data import PromptStream, setup_dataset
from orchestration.loop import LoopState, Parts, push_adapter, save_checkpoint, train_loop
from orchestration.metrics import read_metrics, setup_metrics
from orchestration.plots import write_plots
from orchestration.prompts import PromptRenderer
from rewards.registry import setup_rewards

log = logging.getLogger(__name__)


def restore(parts: Parts) -> LoopState:
    """Resume from the learner's last checkpoint: step, optimizer and data position; push that adapter first."""
    step, extra = ray.get(parts.learner.restore.remote())
    if step == 0:
        return LoopState(step=0, data=parts.stream.state_dict(), saved_step=0)
    parts.stream.load_state_dict(extra["data"])
    # The server is fresh: it must serve the restored policy before the first generation.
    push_adapter(parts, step)
    log.info("resumed at step %d (adapter version %d pushed)", step, step)
    return LoopState(step=step, data=extra["data"], saved_step=step)


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
    first = [r["reward/total"] for r in rows[:k]]
    last = [r["reward/total"] for r in rows[-k:]]
    return {"steps": rows[-1]["step"], f"reward_first_{k}": sum(first) / k, f"reward_last_{k}": sum(last) / k,
            "mean_step_s": sum(r["timing/step"] for r in rows) / len(rows)}


def run(cfg: RunConfig, run_dir: Path) -> None:
    started_cluster = cluster.connect(cfg)
    rollout = None
    parts = state = None
    try:
        learner = cluster.start_learner(cfg, (run_dir / "checkpoints").resolve())
        rollout = cluster.start_rollout(cfg)
        stream = PromptStream(setup_dataset(cfg.data, "train"), cfg.train.prompts_per_step, cfg.data.seed)
        renderer = PromptRenderer(cfg.model.resolved_path, cfg.data.assistant_prefix)
        parts = Parts(rollout, learner, setup_rewards(cfg.rewards), stream, renderer, None)  # type: ignore[arg-type]
        state = restore(parts)
        parts.metrics = setup_metrics(cfg, run_dir, state.step)
        train_loop(cfg, parts, run_dir, state)
        finish(cfg, parts, run_dir)
    except BaseException as exc:
        if parts is not None and state is not None and (state.step > state.saved_step or state.in_flight):
            log.error("run stopped (%s) after step %d; saving a checkpoint so `--resume %s` continues there",
                      type(exc).__name__, state.step, run_dir)
            try:
                save_checkpoint(parts, state)
            except Exception as save_exc:  # keep the original error; say why nothing could be saved
                log.error("could not save the checkpoint: %s", save_exc)
        raise
    finally:
        if parts is not None and parts.metrics is not None:
            parts.metrics.close()
        if rollout is not None:
            rollout.stop()
        if started_cluster:
            ray.shutdown()
