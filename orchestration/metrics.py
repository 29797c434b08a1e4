"""Per-step metrics: one log line, a row in run_dir/metrics.jsonl, TensorBoard scalars, a progress bar with ETA.

Keys are `area/name` (`reward/countdown`, `timing/generate`, `learner/loss`). metrics.jsonl is the record tests and
plots read; the log line is for people.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _finite(value: Any) -> Any:
    # JSON has no NaN/inf; keep the row parseable and make the problem visible instead.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """Writes each step's metrics to every sink; safe to reopen on resume (appends)."""

    def __init__(self, run_dir: Path, total_steps: int, start_step: int = 0, tensorboard: bool = True,
                 progress: str = "auto"):
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = self._open_tensorboard(run_dir / "tb") if tensorboard else None
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
        row = {"step": step, "time": time.time(), **{k: _finite(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        log.info(self.summary_line(step, metrics))
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(reward=f"{metrics.get('reward/total', float('nan')):.3f}")

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
        if self._bar is not None:
            self._bar.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of run_dir/metrics.jsonl; on a resumed run, later rows for a step replace earlier ones."""
    rows: dict[int, dict] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]
