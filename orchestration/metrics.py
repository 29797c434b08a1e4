"""Per-step metrics: one log line, a row in run_dir/metrics.jsonl, TensorBoard scalars, optionally Weights & Biases,
a progress bar with ETA.

Keys are `area/name` (`reward/countdown`, `timing/generate`, `learner/loss`, `eval/accuracy`). metrics.jsonl is the
record tests and plots read; the log line is for people. A step's in-loop eval is written after its train row as a
second row marked `"merge": true`, which `read_metrics` folds into the step's row.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestration.console import CONSOLE

if TYPE_CHECKING:
    from orchestration.config.schema import RunConfig, WandbConfig
    from orchestration.run_dir import RunDir

log = logging.getLogger(__name__)
WANDB_SETUP = "bash scripts/setup_envs.sh"  # requirements/learner.lock pins wandb


def _finite(value: Any) -> Any:
    # JSON has no NaN/inf; keep the row parseable and make the problem visible instead.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """Writes each step's metrics to every sink; safe to reopen on resume (appends)."""

    def __init__(self, run_dir: Path, total_steps: int, start_step: int = 0, tensorboard: bool = True,
                 progress: str = "auto", wandb: WandbConfig | None = None, run_config: dict | None = None,
                 on_write: Callable[[], None] | None = None):
        self.path = run_dir / "metrics.jsonl"
        self._on_write = on_write  # e.g. copy metrics.jsonl to a run dir on shared storage
        self._file = self.path.open("a")
        self._tb = self._open_tensorboard(run_dir / "tb") if tensorboard else None
        self._wandb = open_wandb(wandb, run_dir, run_config or {}) if wandb is not None else None
        show_bar = progress == "on" or (progress == "auto" and sys.stderr.isatty())
        self._bar = self._open_bar(total_steps, start_step) if show_bar else None
        self.total_steps = total_steps
        self._t0, self._s0 = time.monotonic(), start_step

    @staticmethod
    def _open_tensorboard(path: Path):
        from tensorboardX import SummaryWriter

        return SummaryWriter(str(path))

    @staticmethod
    def _open_bar(total: int, start: int):
        from tqdm import tqdm

        return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, file=sys.stderr)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._write(step, metrics)
        log.info(self.summary_line(step, metrics), extra=CONSOLE)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(reward=f"{metrics.get('reward/total', float('nan')):.3f}")

    def log_eval(self, step: int, metrics: dict[str, Any]) -> None:
        """A step's held-out eval, after its train row: merged into that row by read_metrics; no progress tick."""
        self._write(step, metrics, merge=True)
        acc = metrics.get("eval/accuracy")
        log.info("eval at step %d | accuracy %s | reward %.3f | %.1fs", step,
                 "n/a" if acc is None else f"{acc:.3f} [{metrics['eval/accuracy_low']:.3f}, "
                                           f"{metrics['eval/accuracy_high']:.3f}]",
                 metrics.get("eval/reward", float("nan")), metrics.get("timing/eval", 0.0), extra=CONSOLE)

    def _write(self, step: int, metrics: dict[str, Any], merge: bool = False) -> None:
        row = {"step": step, "time": time.time(), **({"merge": True} if merge else {}),
               **{k: _finite(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._on_write is not None:
            self._on_write()
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(_tb_name(key), value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def eta_s(self, step: int) -> float:
        done = step - self._s0
        return (time.monotonic() - self._t0) / done * (self.total_steps - step) if done > 0 else float("nan")

    def summary_line(self, step: int, m: dict[str, Any]) -> str:
        rewards = " ".join(f"{k.split('/', 1)[1]} {v:.3f}" for k, v in m.items()
                           if k.startswith("reward/") and k not in ("reward/total", "reward/total_std", "reward/errors")
                           and isinstance(v, float))
        eta = self.eta_s(step)
        return (f"step {step}/{self.total_steps} | reward {m.get('reward/total', float('nan')):.3f} ({rewards}) | "
                f"len {m.get('rollout/completion_len_mean', 0):.0f} | gen {m.get('timing/generate', 0):.1f}s "
                f"learn {m.get('timing/learn', 0):.1f}s sync {m.get('timing/sync', 0):.2f}s | "
                f"step {m.get('timing/step', 0):.1f}s | eta {eta / 60:.1f} min")

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            import wandb

            self._wandb.finish()
            # finish() can return before wandb's service process has written the run's records (seen: an offline
            # run file holding only its header); teardown waits for that process, so the files are whole on return.
            wandb.teardown()
        if self._bar is not None:
            self._bar.close()


def setup_metrics(cfg: RunConfig, run_dir: RunDir, start_step: int) -> MetricsLog:
    """The run's MetricsLog with every sink cfg.logging asks for, written in the driver's copy of the run dir;
    metrics.jsonl goes to the run dir's storage after every row."""
    lg = cfg.logging
    return MetricsLog(run_dir.local, cfg.train.steps, start_step, lg.tensorboard, lg.progress, lg.wandb,
                      cfg.model_dump(mode="json"), on_write=lambda: run_dir.sync("metrics.jsonl"))


def open_wandb(cfg: WandbConfig, run_dir: Path, run_config: dict):
    """A wandb run writing under run_dir/wandb; the import is lazy, so wandb is needed only when asked for."""
    try:
        import wandb
    except ImportError:
        raise RuntimeError(f"logging.wandb is set but the wandb package is missing from this env (not built from "
                           f"requirements/learner.lock): run `{WANDB_SETUP}`, or set logging.wandb: null") from None
    return wandb.init(project=cfg.project, entity=cfg.entity, name=cfg.name or run_dir.resolve().name, mode=cfg.mode,
                      dir=str(run_dir), config=run_config)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """One row per step from run_dir/metrics.jsonl.

    On a resumed run a later train row for a step replaces the earlier one (and its eval); a `merge` row (the
    step's eval) adds its keys to the step's current row.
    """
    rows: dict[int, dict] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row.pop("merge", False) and row["step"] in rows:
                    row.pop("time", None)
                    rows[row["step"]].update(row)
                else:
                    rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]


def _tb_name(key: str) -> str:
    """TensorBoard's tag alphabet: `eval/pass@4` -> `eval/pass_at_4` (tensorboardX would log an INFO line per
    write and rename it to the less readable `eval/pass_4`)."""
    return key.replace("@", "_at_")
