"""`python -m orchestration.cli.train --config configs/X.yaml [key=value ...] [--resume RUN_DIR]`

What `ray job submit ... -- python -m orchestration.cli.train` runs. It parses and validates the config before
importing Ray, JAX or the engine, so config mistakes cost nothing and print one line each (exit code 2).
SIGINT and SIGTERM are honoured however the process was started (`orchestration.signals`): the run saves its
last finished step, says so in one line and exits 128 + the signal number; a dead learner actor exits 1.
The console shows the step, eval, checkpoint and closing lines and aha's warnings and errors; the whole log goes to
the run directory (orchestration/console.py), and to the console too with `--verbose`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from orchestration import signals
from orchestration.config.schema import RunConfig
from orchestration.config.errors import ConfigError, error_report
from orchestration.config.files import dump_config, load_config
from orchestration.console import setup_logging
from orchestration.run_dir import RunDir, RunDirError
from common.storage import download, exists

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestration.cli.train", description="GRPO training with LoRA.",
                                epilog="Every config key with its type, default and meaning: --help-config.")
    p.add_argument("--config", type=Path, help="YAML config (see configs/); not needed with --resume")
    p.add_argument("--help-config", action="store_true",
                   help="print the config reference (every key, type, default and docstring) and exit")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run (a folder or gs://...) from its last checkpoint")
    p.add_argument("--run-dir", help="where to write this run: a folder, or gs://bucket/path that every host of a "
                                     "cluster reads (default: train.run_dir)")
    p.add_argument("--verbose", action="store_true",
                   help="print the whole log on the console (timestamps, every library's INFO lines, the learner's "
                        "and engines' output); by default it shows the step, eval, checkpoint and closing lines, "
                        "warnings and errors, and the rest goes to RUN_DIR/train.log and RUN_DIR/ray-logs/")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. learner.optimizer.lr=1e-5")
    args = p.parse_args(argv)
    if args.help_config:
        from orchestration.config.reference import render

        sys.stdout.write(render())
        p.exit(0)
    if not args.config and not args.resume:
        p.error("give --config FILE (or --resume RUN_DIR)")
    return args


def resolve(args: argparse.Namespace) -> tuple[RunConfig, RunDir]:
    """The run's config and directory: a new run, or the saved config of the run being resumed."""
    if args.resume:
        run_dir = RunDir(args.resume)
        saved = run_dir.local / "config.yaml"
        if run_dir.remote and exists(run_dir.path("config.yaml")):
            download(run_dir.path("config.yaml"), saved)
        if not saved.exists():
            raise ConfigError(f"--resume {args.resume}: no config.yaml there; is it a run directory?")
        cfg = load_config(saved, args.overrides)
        run_dir.pull()
        return cfg, run_dir
    cfg = load_config(args.config, args.overrides)
    uri = args.run_dir or cfg.train.run_dir.format(name=args.config.stem, time=time.strftime("%Y%m%d-%H%M%S"))
    return cfg, RunDir(uri)


def main(argv: list[str] | None = None) -> int:
    signals.install()
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:  # before run() took over (it says itself where it stopped and what it saved)
        exc = signals.interrupted(exc)
        print(f"train stopped before its first step (interrupted by {exc.name}); nothing to save", file=sys.stderr)
        return exc.exit_code()


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    try:
        cfg, run_dir = resolve(args)
    except ConfigError as err:
        print(error_report(err), file=sys.stderr)
        return 2
    dump_config(cfg, run_dir.local / "config.yaml")
    run_dir.sync("config.yaml")
    setup_logging(run_dir.local, args.verbose)
    log.info("run directory: %s", run_dir)
    from tasks import DataError
    from learner.handle import LearnerDied
    from orchestration.cluster.resources import ResourceError
    from rewards.pool import RewardImportError
    from orchestration.run import run  # imports Ray, the learner and the engine client

    try:
        run(cfg, run_dir, args.verbose)
    except signals.Interrupted as exc:  # run() already said where it stopped and what it saved
        return exc.exit_code()
    except LearnerDied:
        return 1
    except ResourceError as err:  # the cluster cannot hold the run: one line, like a config error
        print(f"resource error: {err}", file=sys.stderr)
        return 2
    except RunDirError as err:  # a run dir the run's hosts cannot share, or a checkpoint the learner cannot see
        print(f"run dir error: {err}", file=sys.stderr)
        return 2
    except DataError as err:  # a data file or data config the run cannot use: before any cluster starts, or a bad row
        print(error_report(err), file=sys.stderr)
        return 2
    except RewardImportError as err:  # a reward by import path that does not load: before any cluster starts
        print(error_report(err), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
