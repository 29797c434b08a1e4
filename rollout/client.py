"""`RolloutClient`: the data plane. Token-id prompts go to the server's completions route, `Completion`s come back.

It runs in the driver and talks HTTP straight to the server (generation traffic never passes through the Ray
actor, which only handles the control plane). One request per prompt carries its n samples, so the engine shares
the prompt's prefill across the group. Concurrency is bounded by a semaphore; connection errors and 5xx are
retried with exponential backoff; 4xx are raised at once (they are our bug, retrying would not help). When the
server cannot be reached after the retries, `ServerUnavailable` tells the caller to check and restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx

from rollout.backend import WireFormat
from rollout.config import ClientConfig
from common.sampling import Completion, SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, made once per process: making it loads the CA bundle, about 40 ms of CPU
    per client on this box, which a multi-turn episode (one client per turn) paid at every turn while the engine
    needed the cores. A context is safe to share between clients and threads."""
    return httpx.create_ssl_context()


class ServerUnavailable(RuntimeError):
    """The server did not answer (connection refused/reset, timeout or 5xx) after all retries."""


class ServerSilent(ServerUnavailable):
    """The server answered no health check for rollout.client.silent_timeout_s while requests were in flight: its
    host may be unreachable, so the caller cannot count on reaching its actor either."""


class RolloutClient:
    """Async client of one server; `wire` is the backend whose payload/response format it speaks."""

    def __init__(self, base_url: str, cfg: ClientConfig, wire: WireFormat):
        self.base_url = base_url.rstrip("/")
        self.cfg = cfg
        self.wire = wire

    def _http(self, on_sent: Callable[[], None] | None = None) -> httpx.AsyncClient:
        # A fresh client per call: an AsyncClient is bound to the event loop it was first used in, and the
        # sync driver runs each generate() in its own asyncio.run().
        hooks = {}
        if on_sent is not None:
            sent = []

            async def first_request(request: httpx.Request) -> None:
                if not sent:
                    sent.append(request)
                    on_sent()
            hooks = {"request": [first_request]}
        limits = httpx.Limits(max_connections=self.cfg.max_concurrency,
                              max_keepalive_connections=self.cfg.max_concurrency)
        timeout = httpx.Timeout(self.cfg.timeout_s, connect=self.cfg.connect_timeout_s)
        return httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=timeout, event_hooks=hooks,
                                 headers=self.wire.auth_headers(), verify=_tls_context())

    async def generate(self, prompts: list[list[int]], params: SamplingParams, adapter: str | None = None,
                       seeds: list[int] | None = None,
                       on_sent: Callable[[], None] | None = None) -> list[list[Completion]]:
        """n completions per prompt from the served adapter named `adapter` (None: the base model), in prompt order;
        all requests are built (and so checked) before any is sent.

        `seeds` gives each prompt's request its own seed (the engine derives its n samples' seeds from it), so a
        step can be redrawn exactly; `on_sent` is called once, as the first request goes out (a test fault hook).
        """
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts; give one seed per prompt")
        per_prompt = ([params] * len(prompts) if seeds is None
                      else [params.model_copy(update={"seed": seed}) for seed in seeds])
        payloads = [self.wire.build_payload(p, sp, adapter) for p, sp in zip(prompts, per_prompt)]
        gate = asyncio.Semaphore(self.cfg.max_concurrency)
        async with self._http(on_sent) as http:

            async def one(payload: dict[str, Any]) -> list[Completion]:
                async with gate:
                    data = await self._post(http, "/v1/completions", payload)
                return self._completions(data, adapter, expected=params.n)

            async def every() -> list[list[Completion]]:
                try:
                    async with asyncio.TaskGroup() as group:  # the first failure cancels the rest
                        tasks = [group.create_task(one(p)) for p in payloads]
                except ExceptionGroup as group_error:  # callers handle our error types, not a group of them
                    raise group_error.exceptions[0] from None
                return [t.result() for t in tasks]

            return await self._unless_silent(every())

    async def _unless_silent(self, work: Coroutine[Any, Any, T]) -> T:
        """`work`'s result, unless the server answers no health check for cfg.silent_timeout_s first: then its
        requests are cancelled and `ServerSilent` raised. A host whose network went silent (link down, packets
        dropped) neither answers nor closes a connection: a request in flight would wait out timeout_s per attempt."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(self._silence())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # its requests cancelled
            raise watch.exception()
        finally:
            watch.cancel()
            task.cancel()  # an outer cancellation (an interrupted caller) ends both; a no-op on a finished task
            # Both ended before the caller closes the connections they use: a request task still running would
            # post on a closed client, an error no one awaits (asyncio prints its traceback at shutdown).
            await asyncio.gather(task, watch, return_exceptions=True)

    async def _silence(self) -> None:
        """Poll GET /health every silent_timeout_s / 4 (each poll waiting as long); raise `ServerSilent` once
        none has succeeded for silent_timeout_s. Its own connection: the requests' pool may be full."""
        limit = self.cfg.silent_timeout_s
        period = limit / 4
        loop = asyncio.get_running_loop()
        answered = loop.time()
        async with httpx.AsyncClient(base_url=self.base_url, timeout=period, headers=self.wire.auth_headers(),
                                     verify=_tls_context()) as http:
            while True:
                await asyncio.sleep(period)
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/health")).status_code == 200:
                        answered = loop.time()
                silent = loop.time() - answered
                if silent >= limit:
                    raise ServerSilent(f"{self.base_url} answered no health check for {silent:.1f} s with "
                                            f"requests in flight (rollout.client.silent_timeout_s = {limit:g}): its "
                                            "host is unreachable or the server hangs")

    async def _post(self, http: httpx.AsyncClient, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        delay = self.cfg.retry_backoff_s
        for attempt in range(self.cfg.max_retries + 1):
            try:
                resp = await http.post(route, json=payload)
            except httpx.TransportError as e:  # connect/read errors and timeouts
                problem = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code == 200:
                    return resp.json()
                if resp.status_code < 500:
                    raise RuntimeError(f"{self.base_url}{route} rejected the request ({resp.status_code}): "
                                       f"{resp.text.strip()[:500]}")
                problem = f"HTTP {resp.status_code}: {resp.text.strip()[:200]}"
            if attempt < self.cfg.max_retries:
                log.warning("%s%s failed (%s); retry %d/%d in %.1f s", self.base_url, route, problem,
                            attempt + 1, self.cfg.max_retries, delay)
                await asyncio.sleep(delay)
                delay *= 2
        raise ServerUnavailable(f"{self.base_url}{route} failed after {self.cfg.max_retries + 1} attempts "
                                f"({problem}); is the server alive? (raise rollout.client.max_retries/timeout_s "
                                "if it is only slow)")

    def _completions(self, data: dict[str, Any], adapter: str | None, expected: int) -> list[Completion]:
        choices = sorted(data["choices"], key=lambda c: c["index"])
        if len(choices) != expected:
            raise RuntimeError(f"server returned {len(choices)} choices for n={expected}")
        out = []
        for choice in choices:
            token_ids, logprobs, extra = self.wire.parse_choice(choice)
            out.append(Completion(token_ids=token_ids, logprobs=logprobs, text=choice.get("text", ""),
                                  finish_reason=choice.get("finish_reason") or "", adapter=adapter,
                                  extra=extra))
        return out

    async def health(self) -> bool:
        """GET /health is 200."""
        async with self._http() as http:
            try:
                return (await http.get("/health", timeout=5.0)).status_code == 200
            except httpx.HTTPError:
                return False
