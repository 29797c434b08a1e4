"""What a run prints on the console, and where the rest of its log goes.

By default the console (stdout) carries only the lines a user follows a run by: those logged with `extra=CONSOLE`
(step lines, in-loop evals, checkpoints, the closing lines), and warnings and errors of aha's own packages (a stop
line, a restarted engine), each as its bare message. Everything else the driver logs, third-party libraries' INFO
and warnings included, goes to `train.log` in the run directory with time, level and logger; the Ray workers' output
(learner, engines) stays in Ray's session logs, linked from the run directory (`ray-logs`). `--verbose` prints all of
it on the console too, with the prefixes, and forwards the Ray workers' output there as well.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

CONSOLE = {"console": True}  # `log.info(..., extra=CONSOLE)`: a line the console shows without --verbose
OWN_PACKAGES = ("orchestration", "rollout", "learner", "rewards", "tasks", "common", "__main__")
LOG_FILE = "train.log"
RAY_LOGS = "ray-logs"
FULL_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")


class ConsoleLines(logging.Filter):
    """The records a quiet console shows: marked ones, and aha's own warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "console", False):
            return True
        own = record.name.split(".")[0] in OWN_PACKAGES
        return record.levelno >= logging.ERROR or (own and record.levelno >= logging.WARNING)


def setup_logging(log_dir: Path, verbose: bool) -> None:
    """INFO and up of every logger to `log_dir/train.log`; the console's share (all of it with `verbose`) to stdout."""
    to_file = logging.FileHandler(log_dir / LOG_FILE)
    to_file.setFormatter(FULL_FORMAT)
    to_console = logging.StreamHandler(sys.stdout)
    if verbose:
        to_console.setFormatter(FULL_FORMAT)
    else:
        to_console.setFormatter(logging.Formatter("%(message)s"))
        to_console.addFilter(ConsoleLines())
        # transformers' "PyTorch was not found" (its own stderr handler, at import): the learner needs no PyTorch
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.basicConfig(level=logging.INFO, handlers=[to_console, to_file], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the step lines


def ray_init_options(verbose: bool) -> dict:
    """`ray.init` keywords: quiet, the workers' output stays in Ray's session logs and Ray's own log lines (its
    token-auth warning, "Started a local Ray instance") reach the root logger's handlers, so `train.log`."""
    if verbose:
        return {"log_to_driver": True}
    logging.getLogger("ray").propagate = True  # ray.init(configure_logging=False) drops Ray's stderr handler
    return {"log_to_driver": False, "configure_logging": False}


def link_ray_logs(log_dir: Path) -> Path | None:
    """`log_dir/ray-logs` -> this node's Ray session logs (the workers' stdout and stderr: learner, engines)."""
    import ray

    node = getattr(ray._private.worker.global_worker, "node", None)
    if node is None:
        return None
    link = log_dir / RAY_LOGS
    if link.is_symlink():  # a resumed run: the link points at this session's logs from now on
        link.unlink()
    elif link.exists():  # a copied run directory (a copy follows the link): keep the copy beside the new link
        link.rename(log_dir / f"{RAY_LOGS}.{time.strftime('%Y%m%d-%H%M%S')}")
    link.symlink_to(node.get_logs_dir_path(), target_is_directory=True)
    return link
