"""`Rollout`: the driver-side object the training loop uses, with plain synchronous methods.

It pairs a `RolloutServer` Ray actor (control plane: process, adapters, restarts) with a `RolloutClient` (data
plane: HTTP straight to the server). `serve(adapter)` puts a `LoraAdapter` on the engine under its name and
`unserve(name)` takes it off; a request names the adapter it samples from (none: the base model) and every
`Completion` records it. When the server dies mid-generate or mid-serve, it asks the actor to restart it (the actor
re-loads every adapter it served), retries the requests (or the serve) once, logs the event and appends it to
`.events`. Requests can carry per-prompt seeds, so a retried step draws the same samples.

    with Rollout(cfg, model_dir) as rollout:          # start() ... stop(); actor_options= from the driver
        rollout.serve(learner.save_for_sampler(name="policy-v1"))
        groups = rollout.generate([[1, 2, 3]], SamplingParams(n=8, max_tokens=64), adapter="policy-v1")
        rollout.unserve("policy-v1")
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.event_loop import run_sync
from common.lora_adapter import LoraAdapter
from rollout.actor import setup_rollout_server
from rollout.backend import setup_backend
from rollout.client import RolloutClient, ServerSilent, ServerUnavailable
from rollout.config import RolloutConfig
from common.sampling import Completion, SamplingParams

log = logging.getLogger(__name__)


def with_run_key(cfg: RolloutConfig) -> RolloutConfig:
    """The rollout config with a fresh API key for its engines unless it names one.

    Every engine we start requires a key on every route but /health (rollout/engine_ext/aha_engine_key.py), on
    loopback too: another local user, a reward function or a peer reaching the address could otherwise sample from
    the policy or unload its adapter. The key lives in this process, the engine's actor and the engine's
    environment only; it is never written to config.yaml nor put on a command line.
    """
    if cfg.backend.api_key is not None:
        return cfg
    return cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"api_key": secrets.token_urlsafe(24)})})


class Rollout:
    """Generate from served adapters (or the base model), serve and unserve them, survive a dead server."""

    def __init__(self, cfg: RolloutConfig, model_path: Path, actor_options: dict[str, Any] | None = None,
                 restart_silent: bool = True):
        self.cfg = cfg = with_run_key(cfg)
        self.model_path = Path(model_path)
        self.actor_options = actor_options
        """Ray options of the server actor (resources, placement), from the driver; None: one CPU, anywhere."""
        self.restart_silent = restart_silent
        """Whether a server silent past rollout.client.silent_timeout_s is restarted in place (through its actor);
        False: `ServerSilent` is raised at once (a fleet takes the replica out and rebuilds it meanwhile)."""
        self.events: list[str] = []
        """What happened to the server besides normal work (restarts and why), oldest first."""
        self.actor = None
        """The RolloutServer actor handle (None before start)."""
        # Only its wire format is used here (pure functions of the config); the process lives in the actor.
        self._wire = setup_backend(cfg.backend, self.model_path)
        self._client: RolloutClient | None = None

    def __enter__(self) -> Rollout:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        """Start the actor and its server (blocks until healthy); return the server's base_url."""
        import ray

        if self.actor is None:
            self.actor = setup_rollout_server(self.cfg, self.model_path, self.actor_options)
        try:
            return self._connect(ray.get(self.actor.start.remote()))
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, ValueError):  # a setting the server cannot start with: its one line
                raise ValueError(str(exc.cause)) from None
            raise

    def _connect(self, base_url: str) -> str:
        self._client = RolloutClient(base_url, self.cfg.client, self._wire)
        return base_url

    @property
    def base_url(self) -> str:
        """URL of the running server."""
        return self._require_client().base_url

    @property
    def base_urls(self) -> list[str]:
        return [self.base_url]

    def auth_headers(self) -> dict[str, str]:
        """The bearer header every request to the server but /health needs (for tools that call it directly)."""
        return self._wire.auth_headers()

    def _require_client(self) -> RolloutClient:
        if self._client is None:
            raise RuntimeError("Rollout is not started; call start() (or use `with Rollout(...) as rollout`)")
        return self._client

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None, *,
                 seeds: list[int] | None = None, on_sent: Callable[[], None] | None = None,
                 adapter: str | None = None) -> list[list[Completion]]:
        """n completions per prompt from the served adapter named `adapter`, None: the base model (default params:
        cfg.sampling).

        `seeds`: one per prompt, so a retried or resumed step draws the same samples. `on_sent`: called once as the
        first request goes out, i.e. with requests in flight (the training loop's fault hook uses it).
        """
        params = params or self.cfg.sampling
        self._check(prompts, params)
        client = self._require_client()
        try:
            return run_sync(client.generate(prompts, params, adapter, seeds, on_sent))
        except ServerUnavailable as err:
            if (isinstance(err, ServerSilent) and not self.restart_silent) or not self._recover():
                raise
        return run_sync(self._require_client().generate(prompts, params, adapter, seeds))

    def _check(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate() needs a non-empty list of non-empty token-id prompts")
        limit = self.cfg.backend.max_model_len
        if (longest := max(len(p) for p in prompts)) + params.max_tokens > limit:
            raise ValueError(f"prompt of {longest} tokens + max_tokens {params.max_tokens} exceeds "
                             f"rollout.backend.max_model_len ({limit}); shorten prompts or lower max_tokens")
        if params.logprobs > self.cfg.backend.max_logprobs:
            raise ValueError(f"sampling.logprobs ({params.logprobs}) exceeds rollout.backend.max_logprobs "
                             f"({self.cfg.backend.max_logprobs}); raise the latter")

    def _recover(self) -> bool:
        """Restart a dead server (re-loading its adapters); False if it is alive, i.e. the failure was not death.
        `ServerUnavailable` when its actor does not answer within rollout.client.silent_timeout_s either: its host
        is unreachable (Ray itself declares a silent node dead only after its own health checks fail)."""
        import ray

        try:
            ray.get(self.actor.node.remote(), timeout=self.cfg.client.silent_timeout_s)
        except ray.exceptions.GetTimeoutError:
            limit = self.cfg.client.silent_timeout_s
            raise ServerUnavailable(f"the rollout server's actor did not answer within {limit:g} s "
                                    "(rollout.client.silent_timeout_s): its host is unreachable") from None
        event = ray.get(self.actor.ensure_alive.remote())
        if event is None:
            return False
        self._record(event)
        self._connect(ray.get(self.actor.base_url.remote()))
        return True

    def _record(self, event: str) -> None:
        log.warning("%s", event)
        self.events.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {event}")

    def serve(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` under its name (replacing one of that name); requests naming it then use these weights."""
        import ray

        self._require_client()
        try:
            ray.get(self.actor.serve.remote(adapter))
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, ValueError):
                raise ValueError(str(exc.cause)) from None
            # A server that died during the serve: restart it (what it served is re-loaded), serve again.
            if not self._recover():
                raise RuntimeError(f"serving adapter {adapter.name} failed with the server alive: "
                                   f"{str(exc).strip().splitlines()[-1][:300]}") from exc
            ray.get(self.actor.serve.remote(adapter))

    def unserve(self, name: str) -> None:
        """Stop serving adapter `name` (a name not served is a no-op); a request naming it is then refused."""
        import ray

        try:
            ray.get(self.actor.unserve.remote(name))
        except ray.exceptions.RayTaskError:
            if not self._recover():  # a server that died meanwhile is restarted without it: nothing left to unload
                raise

    def metrics(self) -> dict[str, float]:
        """Per-replica figures; one server has none beyond the step's own (`RolloutFleet.metrics` has them)."""
        return {}

    def stop(self) -> None:
        """Stop the server and the actor; idempotent."""
        import ray

        actor, self.actor, self._client = self.actor, None, None
        if actor is None:
            return
        try:
            ray.get(actor.shutdown.remote())
        except ray.exceptions.RayActorError:  # the actor already died; its server went down with it (PDEATHSIG)
            log.warning("rollout actor was already dead at stop()")
        finally:
            ray.kill(actor)
