"""`python -m orchestration.train --config configs/X.yaml [key=value ...] [--resume RUN_DIR]`

What `ray job submit ... -- python -m orchestration.train` runs. It parses and validates the config before
importing Ray, JAX or the engine, so config mistakes cost nothing and print one line each (exit code 2).
SIGINT and SIGTERM are honoured however the process was started (`orchestration.signals`): the run saves its
last finished step, says so in one line and exits 128 + the signal number; a dead learner actor exits 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from orchestration import signals
from orchestration.config import ConfigError, RunConfig, dump_config, error_report, load_config

log = logging.getLogger("orchestration.train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestration.train", description="GRPO training with LoRA.")
    p.add_argument("--config", type=Path, help="YAML config (see configs/); not needed with --resume")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--run-dir", type=Path, help="where to write this run (default: train.run_dir)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. learner.optimizer.lr=1e-5")
    args = p.parse_args(argv)
    if not args.config and not args.resume:
        p.error("give --config FILE (or --resume RUN_DIR)")
    return args


def resolve(args: argparse.Namespace) -> tuple[RunConfig, Path]:
    """The run's config and directory: a new run, or the saved config of the run being resumed."""
    if args.resume:
        saved = args.resume / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume {args.resume}: no config.yaml there; is it a run directory?")
        return load_config(saved, args.overrides), args.resume
    cfg = load_config(args.config, args.overrides)
    run_dir = args.run_dir or Path(cfg.train.run_dir.format(name=args.config.stem, time=time.strftime("%Y%m%d-%H%M%S")))
    return cfg, run_dir


def setup_logging(run_dir: Path) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stdout), logging.FileHandler(run_dir / "train.log")]
    for h in handlers:
        h.setFormatter(fmt)
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the step lines


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
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.yaml")
    setup_logging(run_dir)
    log.info("run directory: %s", run_dir.resolve())
    from tasks import DatasetTooSmall
    from orchestration.loop import LearnerDied
    from orchestration.resources import ResourceError
    from orchestration.run import run  # imports Ray, the learner and the engine client

    try:
        run(cfg, run_dir)
    except signals.Interrupted as exc:  # run() already said where it stopped and what it saved
        return exc.exit_code()
    except LearnerDied:
        return 1
    except ResourceError as err:  # the cluster cannot hold the run: one line, like a config error
        print(f"resource error: {err}", file=sys.stderr)
        return 2
    except DatasetTooSmall as err:  # raised before any cluster starts
        print(error_report(err), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
