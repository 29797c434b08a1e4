"""`aha tinker --config configs/X.yaml [key=value ...]`: a Tinker-API training service on aha's learner and engines.

It starts the cluster as `aha train` does (Ray, the learner on its devices or hosts, the engine replicas, each
engine behind the run's key), then serves the Tinker API until Ctrl-C / SIGTERM, so a loop of your own written
against the official SDK runs unmodified:

    TINKER_BASE_URL=http://HOST:PORT TINKER_API_KEY=tml-... python my_loop.py

Every training client is its own LoRA on the one base model (several at once, ranks may differ); checkpoints and
named sampler weights go under `--run-dir` (a folder, or gs://... that every host reads), where a later server
finds them. The URL and key are printed and written to RUN_DIR/tinker.json (readable by its owner only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import socket
import sys
import time
from pathlib import Path

from orchestration import signals
from orchestration.cluster.process_tree import already_running, ending_what_it_started
from orchestration.config.errors import ConfigError, error_report
from orchestration.config.files import dump_config, load_config
from orchestration.config.schema import ServiceConfig

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aha tinker", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="YAML config: model, rollout, learner, ray (data, "
                                                              "rewards and train are the client's business)")
    p.add_argument("--run-dir", help="where checkpoints and sampler weights go: a folder or gs://... "
                                     "(default runs/tinker-<time>)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0: every interface of this node)")
    p.add_argument("--port", type=int, default=8001, help="port to serve on (0: any free one; the URL printed "
                                                           "and written to RUN_DIR/tinker.json says which)")
    p.add_argument("--api-key", help="the key clients send (default: a fresh tml-... key)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. rollout.replicas=2")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    signals.install()
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stdout, force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        cfg = load_config(args.config, args.overrides, ServiceConfig)
    except ConfigError as err:
        print(error_report(err, "tinker"), file=sys.stderr)
        return 2
    from orchestration.service.model_name import served_model

    try:  # before anything starts: a model without a Hugging Face id is refused in a second, not after the cluster
        name = served_model(cfg.model, cfg.rollout.backend.served_model_name).name
    except ValueError as err:
        print(f"tinker: {err}", file=sys.stderr)
        return 2
    api_key = args.api_key or "tml-" + secrets.token_urlsafe(24)
    if not api_key.startswith("tml-"):
        print("tinker: --api-key must start with 'tml-' (the SDK refuses any other key)", file=sys.stderr)
        return 2
    from orchestration.run_dir import RunDir

    run_dir = RunDir(args.run_dir or f"runs/tinker-{time.strftime('%Y%m%d-%H%M%S')}")
    dump_config(cfg, run_dir.local / "config.yaml")
    try:
        listener = listen(args.host, args.port)
    except OSError as err:
        print(f"tinker: cannot listen on {args.host}:{args.port} ({err.strerror}); pass another --port, or "
              "--port 0 for any free one", file=sys.stderr)
        return 2
    try:
        return serve(cfg, run_dir, listener, api_key, name)
    except KeyboardInterrupt as exc:
        exc = signals.interrupted(exc)
        print(f"tinker: stopped (interrupted by {exc.name}); engines and learner are shut down", file=sys.stderr)
        return exc.exit_code()


def listen(host: str, port: int) -> socket.socket:
    """The service's listening socket, bound before anything starts: a port in use fails at once, not after the
    minute the cluster, learner and engines take, and no other process can take the port in between."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's own sites bind
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(cfg, run_dir, listener: socket.socket, api_key: str, name: str) -> int:
    """Start the parts, serve on `listener` until interrupted, stop the parts (`name`: the model's served name)."""
    from aiohttp import web

    from common.hf_cache import hub_dir
    from orchestration.cluster import launch
    from orchestration.service.app import TinkerApp
    from orchestration.service.training import TinkerService

    spare = already_running()
    started = launch.connect(cfg)
    signals.install()  # ray.init replaced the SIGTERM handler
    learner = rollout = None
    try:
        learner = launch.start_learner(cfg, None)
        rollout = launch.start_rollout(cfg)
        service = TinkerService(cfg, learner, rollout, run_dir.uri)
        service.placement = {"driver": launch.driver_address(), "learner": learner.node(), "engines": rollout.base_urls}
        log.info("placement: %s", service.placement)
        app = TinkerApp(service, api_key).build()

        async def run() -> None:
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.SockSite(runner, listener).start()
            host, port = listener.getsockname()[:2]
            dial = launch.driver_address() if host in ("0.0.0.0", "::") else host
            url = f"http://{dial}:{port}"
            info = run_dir.local / "tinker.json"
            info.write_text(json.dumps({"base_url": url, "api_key": api_key, "pid": os.getpid()}))
            info.chmod(0o600)
            print(f"\nTinker API ready: TINKER_BASE_URL={url} TINKER_API_KEY={api_key}\n"
                  f"  base model {name} ({cfg.model.path}); checkpoints under {run_dir}; Ctrl-C stops it\n"
                  f"  a client loads its tokenizer with HF_HUB_CACHE={hub_dir()} HF_HUB_OFFLINE=1", flush=True)
            try:
                while True:
                    await asyncio.sleep(3600)
            finally:
                await runner.cleanup()

        asyncio.run(run())
        return 0
    finally:
        with ending_what_it_started(spare):  # what a part's stop leaves behind is ended before the service returns
            if rollout is not None:
                rollout.stop()
            if learner is not None:
                learner.kill()
            if started:
                launch.disconnect()


if __name__ == "__main__":
    sys.exit(main())
