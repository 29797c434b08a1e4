"""`RolloutFleet`: N engine replicas behind the methods of one `Rollout` (`rollout.replicas: N`).

Each replica is a plain `Rollout` (its own RolloutServer actor, engine process and resources), so everything a
single server does (adapters served by name, restart of a dead engine with its adapters re-loaded) still holds per
replica. The fleet adds:
- spreading: each prompt group (one request carrying its n samples, so they share the prefill and stay on one
  replica) goes to the live replica with the fewest outstanding requests;
- serving: an adapter goes to every live replica at once, and `serve` returns only when all have it, so a request
  naming it may go to any of them; the fleet keeps one map of what it serves, by name;
- failures: a replica whose request or serve fails is taken out, its in-flight groups are retried on the other
  replicas, and it is rebuilt in the background (new actor, engine started, every served adapter loaded) while the
  others keep serving; it rejoins only once it serves exactly what the fleet serves;
- per-replica metrics (`metrics()`): requests, tokens/s while generating, restarts.

A replica may run on another node than the driver (its server then listens on that node's address, behind the
run's API key); a replica whose node is lost fails like a dead one: it is taken out and rebuilt wherever Ray finds
room, and a rebuild that has nowhere to go is cancelled when the fleet stops.

On a TPU slice each replica asks for its chips through `rollout.resources`; with accelerators the replicas are
placed one per bundle of a placement group that the driver reserves (orchestration/cluster/placement.py): a host's chips may
hold several replicas' groups. Each replica's server actor gets its own environment from the driver (`replica_env`:
its libtpu port and bounds, so engines sharing a host coexist), which its engine process inherits.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from common.lora_adapter import LoraAdapter
from rollout.client import ServerUnavailable
from rollout.config import RolloutConfig
from rollout.handle import Rollout, with_run_key
from common.sampling import Completion, SamplingParams

log = logging.getLogger(__name__)


def is_replica_failure(err: BaseException) -> bool:
    """The replica failed, not the request: its server stayed unreachable after the handle's own restart and
    retries, its actor died, or its actor failed a call for a reason other than a bad argument (ValueError). Anything
    else (a request the engine rejects, bad input) is the caller's error and must propagate, not cause a rebuild."""
    if isinstance(err, (ServerUnavailable, ray.exceptions.RayActorError)):
        return True
    return isinstance(err, ray.exceptions.RayTaskError) and not isinstance(err.cause, ValueError)


@dataclass
class Replica:
    """One engine replica and its counters."""

    index: int
    rollout: Rollout
    live: bool = True
    outstanding: int = 0
    requests: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    restarts: int = 0
    seen_events: int = 0
    rebuild: concurrent.futures.Future | None = field(default=None, repr=False)


class RolloutFleet:
    """Generate across N replicas, serve every adapter on all of them, rebuild dead ones."""

    def __init__(self, cfg: RolloutConfig, model_path: Path, replicas: int | None = None, placement: Any = None,
                 actor_options: dict[str, Any] | None = None, replica_env: list[dict[str, str]] | None = None):
        self.cfg = with_run_key(cfg)  # one key for every replica, rebuilt ones included
        self.model_path = Path(model_path)
        self._actor_options = actor_options or {}  # each replica's Ray resources, from the driver
        self.n = replicas or cfg.replicas
        self._replica_env = replica_env or [{} for _ in range(self.n)]  # replica i's own variables, from the driver
        self.events: list[str] = []
        """What happened to any replica besides normal work (restarts and why), oldest first. Published at the end
        of each generate(), so one that happened during a push or a background rebuild is counted with the next
        step's generation (the loop counts the events appearing during generate)."""
        self._unpublished: list[str] = []
        self.served: dict[str, LoraAdapter] = {}
        """Every adapter the fleet serves, by name (what a rebuilt replica loads before it rejoins)."""
        self._placement = placement  # a placement group with one bundle per replica, or None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # Requests and control work (serves, rebuilds) get separate pools: requests waiting for a rebuilt replica
        # must never hold the threads that rebuild it.
        requests = min(256, self.n * cfg.client.max_concurrency)
        self._pool = concurrent.futures.ThreadPoolExecutor(requests, thread_name_prefix="fleet-request")
        self._control = concurrent.futures.ThreadPoolExecutor(2 * self.n, thread_name_prefix="fleet-control")
        self.replicas = [Replica(i, self._new_rollout(i)) for i in range(self.n)]

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def _new_rollout(self, index: int) -> Rollout:
        options = with_env(self._actor_options, self._replica_env[index])
        if self._placement is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self._placement,
                                                                              placement_group_bundle_index=index)
        # A silent replica is taken out at once, not restarted in place: its host may be unreachable, and its
        # actor with it until Ray's own health checks give up on the node (rollout.client.silent_timeout_s).
        return Rollout(self.cfg, self.model_path, options, restart_silent=False)

    def start(self) -> str:
        """Start every replica's server concurrently (blocks until all are healthy); their base_urls, joined."""
        urls = list(self._control.map(lambda r: r.rollout.start(), self.replicas))
        return ",".join(urls)

    @property
    def actor(self):
        """The first replica's RolloutServer actor (for tools and fault hooks that address one server)."""
        return self.replicas[0].rollout.actor

    @property
    def base_url(self) -> str:
        """The first live replica's URL (for tools that talk to one server)."""
        return next(r.rollout.base_url for r in self.replicas if r.live)

    @property
    def base_urls(self) -> list[str]:
        return [r.rollout.base_url for r in self.replicas]

    def auth_headers(self) -> dict[str, str]:
        """The bearer header every request to a replica but /health needs (the replicas share one key)."""
        return self.replicas[0].rollout.auth_headers()

    def stop(self) -> None:
        """Stop every replica (background rebuilds are cancelled first); idempotent."""
        for r in self.replicas:
            self._cancel_rebuild(r)
            r.rollout.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._control.shutdown(wait=True, cancel_futures=True)
        if self._placement is not None:
            import ray

            ray.util.remove_placement_group(self._placement)
            self._placement = None

    def __enter__(self) -> RolloutFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- data plane ------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None, *,
                 seeds: list[int] | None = None, on_sent: Callable[[], None] | None = None,
                 adapter: str | None = None) -> list[list[Completion]]:
        """n completions per prompt from the served adapter `adapter` (None: the base model); groups spread by least
        outstanding requests.

        `seeds` (one per prompt) and `adapter` are passed on as `Rollout.generate` takes them, so a
        group draws the same samples whichever replica serves it. `on_sent` is called once, when every group's
        request has gone out (so each replica a group went to has work in flight: a test fault lands there).
        """
        params = params or self.cfg.sampling
        if not prompts:
            raise ValueError("generate() needs a non-empty list of non-empty token-id prompts")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate() got {len(seeds)} seeds for {len(prompts)} prompts; give one per prompt")
        sent = AllSent(len(prompts), on_sent)
        futures = [self._pool.submit(self._generate_group, p, params, None if seeds is None else seeds[i], adapter,
                                     sent.one()) for i, p in enumerate(prompts)]
        try:
            return [f.result() for f in futures]
        finally:
            self._collect_events()

    def _generate_group(self, prompt: list[int], params: SamplingParams, seed: int | None,
                        adapter: str | None = None, on_sent: Callable[[], None] | None = None) -> list[Completion]:
        """One group on the least-loaded live replica; on failure, take that replica out and try another."""
        tried: set[int] = set()
        kwargs = {"adapter": adapter, **({} if seed is None else {"seeds": [seed]})}
        while True:
            replica = self._acquire(tried)
            t0 = time.perf_counter()
            try:
                [group] = replica.rollout.generate([prompt], params, on_sent=on_sent, **kwargs)
            except Exception as err:
                self._release(replica, None, 0.0)
                if not is_replica_failure(err):
                    raise
                tried.add(replica.index)
                self._take_out(replica, f"generate failed ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
                continue
            self._release(replica, group, time.perf_counter() - t0)
            return group

    def _acquire(self, tried: set[int]) -> Replica:
        with self._idle:
            while True:
                live = [r for r in self.replicas if r.live and r.index not in tried]
                if live:
                    replica = min(live, key=lambda r: (r.outstanding, r.index))
                    replica.outstanding += 1
                    return replica
                if not any(r.rebuild is not None and not r.rebuild.done() for r in self.replicas):
                    recent = (self.events + self._unpublished)[-3:]
                    raise RuntimeError(f"every rollout replica failed this request ({len(self.replicas)} tried, "
                                       f"events: {recent}); see the replicas' server logs")
                tried.clear()  # every live one failed it: wait for a rebuilt replica and try again
                self._idle.wait(timeout=5.0)

    def _release(self, replica: Replica, group: list[Completion] | None, seconds: float) -> None:
        with self._idle:
            replica.outstanding -= 1
            if group is not None:
                replica.requests += 1
                replica.tokens += sum(len(c.token_ids) for c in group)
                replica.busy_s += seconds
            self._idle.notify_all()

    # ---- control plane ---------------------------------------------------------------------------------------
    def serve(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` on every live replica concurrently (and on every rebuilt one); returns when all have it."""
        with self._lock:
            before, self.served[adapter.name] = self.served.get(adapter.name), adapter
        try:
            self._on_live(f"serve of adapter {adapter.name}", lambda r: r.rollout.serve(adapter))
        except ValueError:  # refused (e.g. its rank): the replicas kept what they served, and so does the map
            with self._lock:
                if before is None:
                    self.served.pop(adapter.name, None)
                else:
                    self.served[adapter.name] = before
            raise

    def unserve(self, name: str) -> None:
        """Stop serving adapter `name` on every live replica."""
        with self._lock:
            self.served.pop(name, None)
        self._on_live(f"unserve of adapter {name}", lambda r: r.rollout.unserve(name))

    def _on_live(self, what: str, call: Callable[[Replica], Any]) -> None:
        """`call` on every live replica concurrently; a replica that fails it is taken out and rebuilt."""
        with self._lock:
            live = [r for r in self.replicas if r.live]
        futures = {self._control.submit(call, r): r for r in live}
        for future, replica in futures.items():
            err = future.exception()
            if err is not None and not is_replica_failure(err):
                raise err
            if err is not None:
                self._take_out(replica, f"{what} failed ({type(err).__name__})")
        if not any(r.live for r in self.replicas):
            self._wait_for_rebuilds()

    def _take_out(self, replica: Replica, why: str) -> None:
        """Stop sending work to `replica` and rebuild it in the background (once)."""
        with self._idle:
            if not replica.live:
                return
            replica.live = False
            replica.restarts += 1
            self._record(f"rollout replica {replica.index} out: {why}; rebuilding it while the others serve")
            replica.rebuild = self._control.submit(self._rebuild, replica)

    def _rebuild(self, replica: Replica) -> None:
        """A fresh actor + engine for `replica`, serving what the fleet serves, then back in service."""
        old = replica.rollout
        try:
            old.stop()
        except Exception as err:  # noqa: BLE001 - the old actor may already be gone; the new one matters
            log.warning("rollout replica %d: stopping the dead one failed (%s)", replica.index, err)
        fresh = self._new_rollout(replica.index)
        with self._lock:
            replica.rollout, replica.seen_events = fresh, 0  # stop() stops it even if its start fails
        fresh.start()
        loaded: dict[str, LoraAdapter] = {}
        while True:  # a serve or unserve may land while this replica is starting: catch up until it serves the same
            with self._lock:
                wanted = dict(self.served)
            for name in [n for n in loaded if n not in wanted]:
                fresh.unserve(name)
                del loaded[name]
            for name, adapter in wanted.items():
                if loaded.get(name) is not adapter:
                    fresh.serve(adapter)
                    loaded[name] = adapter
            with self._idle:
                if self.served == loaded:
                    replica.live = True
                    self._record(f"rollout replica {replica.index} rebuilt and serving adapters {sorted(loaded)}")
                    self._idle.notify_all()
                    return

    @staticmethod
    def _cancel_rebuild(replica: Replica) -> None:
        """End a rebuild still running: kill its new actor until the rebuild gives up. A replica whose node was lost
        may have nowhere to go (its resources left with the node), and its actor would wait for a node forever."""
        while replica.rebuild is not None and not replica.rebuild.done():
            if (actor := replica.rollout.actor) is not None:
                ray.kill(actor)
            concurrent.futures.wait([replica.rebuild], timeout=2.0)

    def _wait_for_rebuilds(self) -> None:
        pending = [r.rebuild for r in self.replicas if r.rebuild is not None]
        for future in concurrent.futures.as_completed(pending):
            future.result()  # a replica that cannot be rebuilt ends the run with its own error

    # ---- events and metrics ----------------------------------------------------------------------------------
    def _record(self, event: str) -> None:
        log.warning("%s", event)
        self._unpublished.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {event}")

    def _collect_events(self) -> None:
        """Publish the fleet's events and the replicas' own (an engine restarted inside its handle)."""
        with self._lock:
            self.events.extend(self._unpublished)
            self._unpublished.clear()
            for r in self.replicas:
                new = r.rollout.events[r.seen_events:]
                r.seen_events += len(new)
                r.restarts += len(new)  # a handle's own events are engine restarts
                self.events.extend(f"replica {r.index}: {e}" for e in new)

    def metrics(self) -> dict[str, float]:
        """`rollout/replica{i}/...`: requests, tokens/s while generating, restarts (since the fleet started)."""
        out: dict[str, float] = {}
        for r in self.replicas:
            out[f"rollout/replica{r.index}/requests"] = float(r.requests)
            out[f"rollout/replica{r.index}/tokens_per_s"] = r.tokens / r.busy_s if r.busy_s else 0.0
            out[f"rollout/replica{r.index}/restarts"] = float(r.restarts)
        return out


class AllSent:
    """`callback` once each of `count` groups has said its request went out (`one()` gives a group its own
    callback; a group retried elsewhere may call it again, which counts once)."""

    def __init__(self, count: int, callback: Callable[[], None] | None):
        self._left, self._callback, self._lock = count, callback, threading.Lock()

    def one(self) -> Callable[[], None] | None:
        if self._callback is None:
            return None
        said = []

        def sent() -> None:
            with self._lock:
                if said:
                    return
                said.append(True)
                self._left -= 1
                last = self._left == 0
            if last:
                self._callback()

        return sent


def with_env(options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Ray options whose runtime_env also sets `env` (over the env_vars already there)."""
    if not env:
        return dict(options)
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
    return {**options, "runtime_env": runtime_env}


def setup_rollout(cfg: RolloutConfig, model_path: Path, placement: Any = None,
                  actor_options: dict[str, Any] | None = None, replica_env: list[dict[str, str]] | None = None
                  ) -> Rollout | RolloutFleet:
    """One `Rollout` (replicas=1) or a `RolloutFleet`, not started. The driver decides where the engines run:
    `actor_options` are each server actor's Ray resources, `placement` (a placement group it reserved) gives each
    replica one bundle; None puts them wherever Ray likes. `replica_env`: replica i's own environment variables
    (its server actor's, which its engine process inherits), or None."""
    if cfg.replicas == 1:
        return Rollout(cfg, model_path, with_env(actor_options or {}, (replica_env or [{}])[0]) or None)
    return RolloutFleet(cfg, model_path, placement=placement, actor_options=actor_options, replica_env=replica_env)
