"""`python -m orchestration.cli.serve RUN_DIR`: serve a trained adapter through the same engine as training.

Starts the run's engine (its rollout.backend config: vLLM or SGLang-JAX) on the base model with the run's final
adapter attached under the name `--name` (default: the run directory's name), OpenAI-compatible (completions and
chat completions), loopback by default, optional API key; prints a ready curl example and serves until Ctrl-C.
`--base-only` serves the base model alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import time
from pathlib import Path

from orchestration import signals
from orchestration.cluster.process_tree import already_running, ending_what_it_started
from orchestration.config.schema import RunConfig
from orchestration.config.errors import ConfigError, error_report
from orchestration.config.files import load_config
from orchestration.run_dir import local_copy
from common.peft_adapter import ADAPTER_CONFIG
from common.storage import absolute


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestration.cli.serve", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", help="a training run directory (has config.yaml and adapter/), or its gs:// URI")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000, help="port to serve on (0: any free one; the URL printed says "
                                                           "which)")
    p.add_argument("--name", help="model name clients use for the adapter (default: the run directory's name)")
    p.add_argument("--api-key", help="the bearer token every route but /health requires (default: a fresh one, "
                                     "printed; a key given here is visible to local users in the process list)")
    p.add_argument("--base-only", action="store_true", help="serve the base model without the adapter")
    return p.parse_args(argv)


def serving_backend(cfg: RunConfig, args: argparse.Namespace, adapter_dir: Path | None, name: str):
    """The run's engine config (vLLM or SGLang-JAX), pointed at host/port, with the adapter attached at start-up."""
    from rollout.engine_config import StartupAdapter

    adapter = None if adapter_dir is None else StartupAdapter(name=name, path=adapter_dir)
    return cfg.rollout.backend.model_copy(update={"host": args.host, "port": args.port, "api_key": args.api_key,
                                                  "startup_adapter": adapter})


def curl_example(url: str, name: str, api_key: str | None, prompt: str) -> str:
    auth = f" -H 'Authorization: Bearer {api_key}'" if api_key else ""
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": prompt}], "max_tokens": 256,
                       "temperature": 0.7})
    return f"curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


def main(argv: list[str] | None = None) -> int:
    signals.install()  # Ctrl-C / SIGTERM work even when started with SIGINT ignored (nohup, `&` in a script)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_dir = local_copy(args.run_dir)  # a run on shared storage: its config and adapter, fetched
        cfg = load_config(run_dir / "config.yaml")
        adapter_dir = None if args.base_only else (run_dir / "adapter").resolve()
        if adapter_dir is not None and not (adapter_dir / ADAPTER_CONFIG).exists():
            raise ConfigError(f"{adapter_dir} has no {ADAPTER_CONFIG}: the run has not finished; "
                              f"`python -m orchestration.cli.train --resume {args.run_dir}` completes it, or use --base-only")
        if args.api_key in (None, "random"):  # every engine we start is keyed (rollout/engine_ext/aha_engine_key.py)
            args.api_key = secrets.token_urlsafe(24)
        name = args.name or ("base" if args.base_only else Path(absolute(args.run_dir)).name)
        backend_cfg = serving_backend(cfg, args, adapter_dir, name)
    except ConfigError as err:
        print(error_report(err, "serve"), file=sys.stderr)
        return 2
    from tasks import setup_dataset
    from rollout.backend import setup_backend

    spare = already_running()
    backend = setup_backend(backend_cfg, cfg.model.resolved_path, run_dir / "serve")
    try:
        url = backend.start()
        example = setup_dataset(cfg.data, "eval")[0]
        prompt = example.messages[-1]["content"] if example.messages else example.text
        print(f"\nserving {name!r} ({cfg.model.path} + {'no adapter' if adapter_dir is None else adapter_dir}) at {url}")
        print(f"API key: {args.api_key}")
        print("try:\n  " + curl_example(url, name, args.api_key, prompt) + "\n\nCtrl-C stops the server.", flush=True)
        while True:  # SIGINT or SIGTERM (orchestration.signals) ends the wait
            time.sleep(1.0)
            if not backend.is_alive():
                print("serve: the engine exited; its log:\n" + backend.log_tail(50), file=sys.stderr)
                return 1
    except KeyboardInterrupt as exc:
        exc = signals.interrupted(exc)
        backend.stop()  # first, so the line below is the last one and true
        print(f"serve: stopped (interrupted by {exc.name}); the engine is shut down", file=sys.stderr)
        return exc.exit_code()
    finally:
        with ending_what_it_started(spare):  # what the engine's stop leaves behind is ended before serve returns
            backend.stop()  # idempotent


if __name__ == "__main__":
    sys.exit(main())
