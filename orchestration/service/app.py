"""The Tinker API over HTTP, as the official SDK (`tinker` 0.38) sends it: routes, auth, futures, errors.

Every request must carry the server's key in `X-API-Key` (the SDK sends TINKER_API_KEY there; it wants a `tml-`
prefix, which the server's generated keys have). Work (create_model, forward_backward, optim_step, saves, loads,
sample) answers `{"request_id"}` at once and its outcome comes from `/api/v1/retrieve_future`. A training client's
operations run in the order of their `seq_id`s, and the same (model, seq_id) sent twice (a retried POST) is the
same job; an op refused before it was queued gives its number up, so the client's next op still runs. Mistakes are
answered as the SDK expects them: a failed future `{"error", "category": "user"}` (RequestFailedError), or a 4xx
with a JSON `detail` line and `x-should-retry: false` (BadRequestError, NotFoundError), which the SDK does not
retry; never a traceback. A full queue (api.max_pending_ops) is a 429, which the SDK retries with backoff, and a
future this server does not know (it restarted) a 410, on which the SDK's samplers resubmit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from orchestration.service.checkpoints import SaveOptions
from orchestration.service.futures import Futures, Outcome, QueueFull, UserError
from orchestration.service.rest import FILES, RestRoutes
from orchestration.service.training import TinkerService, TrainingModel, training_model_id
from orchestration.service import wire

log = logging.getLogger(__name__)
API = "/api/v1"
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False, "use_pyqwest_transport": False, "parallel_fwdbwd_chunks": True,
    "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
    "sample_join_sampling_session": False, "sample_no_retries": False,
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


SEQUENCED = "aha_sequenced"  # request key: the (training client, seq_id) a refusal gives up


def detail(status: int, message: str, retry: bool = False) -> web.Response:
    # x-should-retry: false, so the SDK reports it at once instead of retrying a request that cannot succeed.
    return web.json_response({"detail": message}, status=status,
                             headers={"x-should-retry": "true" if retry else "false"})


class TinkerApp:
    """The routes over one TinkerService."""

    def __init__(self, service: TinkerService, api_key: str):
        self.service, self.api_key = service, api_key
        self.futures = Futures(service.cfg.api.max_pending_ops)
        self.max_body = int(service.cfg.api.max_body_mb * (1 << 20))
        self._by_seq: dict[tuple[str, int], str] = {}  # (model_id, seq_id) -> request_id: a retried POST is one job
        self.rest = RestRoutes(service, api_key)

    def build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=self.max_body)
        app.cleanup_ctx.append(self._sweeping)
        post, get = app.router.add_post, app.router.add_get
        post(f"{API}/client/config", lambda r: self._json(CLIENT_CONFIG))
        post(f"{API}/client/dynamic_config", lambda r: self._json({"refresh_interval_sec": 300,
                                                                   "sample_cancel_enabled": False}))
        post(f"{API}/telemetry", lambda r: self._json({"status": "accepted"}))
        post(f"{API}/session_heartbeat", lambda r: self._json({"type": "session_heartbeat"}))
        post(f"{API}/sessions/{{session_id}}/finish", lambda r: self._json({}))
        get(f"{API}/healthz", lambda r: self._json({"status": "ok"}))
        get(f"{API}/get_server_capabilities", lambda r: self._json(self.service.capabilities()))
        post(f"{API}/create_session", self.create_session)
        post(f"{API}/get_info", self.get_info)
        post(f"{API}/create_model", self.create_model)
        post(f"{API}/forward_backward", self.forward_backward)
        post(f"{API}/optim_step", self.optim_step)
        post(f"{API}/save_weights", self.save_weights)
        post(f"{API}/save_weights_for_sampler", self.save_weights_for_sampler)
        post(f"{API}/save_weights_external", self.save_weights_external)
        post(f"{API}/load_weights", self.load_weights)
        post(f"{API}/create_sampling_session", self.create_sampling_session)
        get(f"{API}/samplers/{{sampler_id}}", self.get_sampler)
        post(f"{API}/asample", self.asample)
        post(f"{API}/retrieve_future", self.retrieve_future)
        self.rest.add_to(app)  # training runs, checkpoints, weights downloads, sessions (orchestration/service/rest.py)
        return app

    # ---- plumbing ------------------------------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The key, then the route; a mistake becomes one JSON line, never a traceback."""
        # a signed download URL carries no key (the SDK's CLI fetches it with plain urllib): its signature instead
        signed = request.path.startswith(FILES) and self.rest.signed(request)
        if request.headers.get("X-API-Key") != self.api_key and not signed:
            return detail(401, "missing or wrong API key: set TINKER_API_KEY to the key `aha tinker` printed")
        try:
            return await handler(request)
        except QueueFull as err:  # the op keeps its number: the SDK sends it again
            return detail(429, str(err), retry=True)
        except Exception as err:
            if (taken := request.get(SEQUENCED)) is not None:  # refused before it was queued: give its number up
                model, seq_id = taken
                await model.sequencer.skip(seq_id)
            return self._refusal(request, err)

    def _refusal(self, request: web.Request, err: Exception) -> web.Response:
        """The client's own mistakes as 4xx (not retried), anything else as one 500 line."""
        if isinstance(err, web.HTTPRequestEntityTooLarge):
            return detail(413, f"a {request.method} {request.path} body over {self.max_body >> 20} MiB; send less "
                               "per call, or raise api.max_body_mb in the server's config")
        if isinstance(err, web.HTTPException):
            if err.status == 404:
                return detail(404, f"{request.method} {request.path}: no such route on this server")
            return detail(err.status, f"{request.method} {request.path}: {err.reason}")
        if isinstance(err, (UserError, ValueError, TypeError)):
            return detail(400, str(err))
        if isinstance(err, KeyError):
            return detail(404, f"{err.args[0]!r} is not known to this server")
        log.exception("%s %s failed", request.method, request.path, exc_info=err)
        return detail(500, f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")

    async def _sweeping(self, app: web.Application):
        """Expired checkpoints deleted every api.checkpoint_sweep_s while the server runs."""
        async def sweep() -> None:
            while True:
                await asyncio.sleep(self.service.cfg.api.checkpoint_sweep_s)
                try:
                    await asyncio.to_thread(self.service.records.sweep)
                except Exception:  # storage down for a while: the next sweep tries again
                    log.exception("checkpoint sweep failed")

        task = asyncio.create_task(sweep())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @staticmethod
    async def _json(body: dict[str, Any]) -> web.Response:
        return web.json_response(body)

    def _future(self, kind: str, work: Callable[[], Awaitable[Outcome]], model_id: str | None = None,
                seq_id: int | None = None, bounded: bool = True, **extra: Any) -> web.Response:
        key = (model_id, seq_id) if model_id is not None and seq_id is not None else None
        if key is not None and self._by_seq.get(key) in self.futures:  # a retried POST of an op already taken
            request_id = self._by_seq[key]
        else:
            request_id = self.futures.submit(kind, work, bounded)
            if key is not None:
                self._by_seq[key] = request_id
                if len(self._by_seq) > 2 * len(self.futures) + 64:  # the futures forgot their jobs
                    self._by_seq = {k: r for k, r in self._by_seq.items() if r in self.futures}
        return web.json_response({"request_id": request_id, **({"model_id": model_id} if model_id else {}),
                                  **extra})

    def _retried(self, body: dict[str, Any]) -> web.Response | None:
        """The answer already given to this (session, model_seq_id): a retried create is the same job."""
        model_id = training_model_id(body.get("session_id"), int(body.get("model_seq_id", 0)))
        if (model_id, 0) not in self._by_seq:
            return None
        return web.json_response({"request_id": self._by_seq[(model_id, 0)], "model_id": model_id})

    @staticmethod
    def _taking(request: web.Request, m: TrainingModel, seq_id: Any) -> int:
        """`seq_id` of `m` is this request's: a refusal from here on gives it up (the middleware skips it)."""
        request[SEQUENCED] = (m, int(seq_id))
        return int(seq_id)

    def _sequenced(self, kind: str, m: TrainingModel, seq_id: int, work: Callable[[], Awaitable[Outcome]]):
        return self._future(kind, lambda: m.sequencer.run(seq_id, work), m.model_id, seq_id, bounded=False)

    async def _read_capped(self, request: web.Request) -> tuple[bytes, int]:
        """The body and its size; past max_body only its first MiB is kept (the rest is read and dropped, so the
        client gets the 413, not a reset connection it would retry)."""
        kept, size = [], 0
        async for chunk in request.content.iter_chunked(1 << 20):
            size += len(chunk)
            if size <= self.max_body or sum(map(len, kept)) < 1 << 20:
                kept.append(chunk)
        return b"".join(kept), size

    # ---- sessions and training clients ----------------------------------------------------------------------------
    async def create_session(self, request: web.Request) -> web.Response:
        body = await request.json()
        session_id = self.service.create_session(body.get("user_metadata"))
        return web.json_response({"type": "create_session", "session_id": session_id})

    async def get_info(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(self.service.get_info(body["model_id"]))

    async def create_model(self, request: web.Request) -> web.Response:
        body = await request.json()
        if retried := self._retried(body):
            return retried
        self.futures.check_room()  # before the client exists: a 429 makes the SDK send the same create again
        m = self.service.new_model(body["session_id"], int(body.get("model_seq_id", 0)), body.get("base_model"),
                                   body.get("lora_config") or {}, body.get("user_metadata"), first_seq=1)
        seed = (body.get("lora_config") or {}).get("seed")
        return self._future("create_model", lambda: self.service.create_model(m, seed), m.model_id, 0)

    async def forward_backward(self, request: web.Request) -> web.Response:
        body, size = await self._read_capped(request)
        if size > self.max_body:  # its number still goes: the head (model_id, seq_id) leads the body
            model_id, seq_id = wire.read_head(body)
            self._taking(request, self.service.model(model_id), seq_id)
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_body, actual_size=size)
        head = wire.read_forward_backward(body)
        m = self.service.model(head.model_id)
        self._taking(request, m, head.seq_id)
        if request.headers.get("Content-Encoding"):
            raise UserError("a compressed forward_backward body; this server answers proto_compress_fwdbwd: false")
        kind = "forward" if head.forward_only else "forward_backward"
        return self._sequenced(kind, m, head.seq_id,
                               lambda: self.service.forward_backward(m, body, head.forward_only))

    async def optim_step(self, request: web.Request) -> web.Response:
        body = await request.json()
        m = self.service.model(body["model_id"])
        seq_id = self._taking(request, m, body["seq_id"])
        if body.get("optimizer_params") is not None and body.get("adam_params") is None:
            raise UserError(f"optimizer {body['optimizer_params'].get('type')!r}: this server steps with AdamW "
                            "(adam_params) only")
        return self._sequenced("optim_step", m, seq_id,
                               lambda: self.service.optim_step(m, body.get("adam_params")))

    async def save_weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        m = self.service.model(body["model_id"])
        seq_id = self._taking(request, m, body["seq_id"])
        keep = SaveOptions.of(body, self.service.records)
        return self._sequenced("save_weights", m, seq_id, lambda: self.service.save_state(m, str(body["path"]), keep))

    async def save_weights_external(self, request: web.Request) -> web.Response:
        body = await request.json()
        m = self.service.model(body["model_id"])
        seq_id = self._taking(request, m, body["seq_id"])
        if body.get("age_encryption_recipients"):
            raise UserError("age_encryption_recipients: this server writes external weights unencrypted (its run "
                            "directory is yours); leave it out")
        keep = SaveOptions.of(body, self.service.records)
        return self._sequenced("save_weights_external", m, seq_id,
                               lambda: self.service.save_external(m, str(body["path"]), keep))

    async def save_weights_for_sampler(self, request: web.Request) -> web.Response:
        body = await request.json()
        m = self.service.model(body["model_id"])
        seq_id = self._taking(request, m, body["seq_id"])
        session = m.model_id.split(":")[0]
        seq = body.get("sampling_session_seq_id")
        keep = SaveOptions.of(body, self.service.records)
        return self._sequenced("save_weights_for_sampler", m, seq_id, lambda: self.service.save_for_sampler(
            m, body.get("path"), None if seq is None else int(seq), session, body.get("kind") or "snapshot", keep))

    async def load_weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        path, optimizer = str(body["path"]), bool(body.get("optimizer", False))
        if "model_id" in body:  # the deprecated load_state on an existing training client
            m = self.service.model(body["model_id"])
            return self._sequenced("load_weights", m, self._taking(request, m, body["seq_id"]),
                                   lambda: self.service.load_state(m, path, optimizer))
        # create_training_client_from_state: a new training client whose first operation is this load
        if retried := self._retried(body):
            return retried
        self.futures.check_room()
        m = self.service.new_model(body["session_id"], int(body.get("model_seq_id", 0)), body.get("base_model"),
                                   None, body.get("user_metadata"), first_seq=1)
        return self._future("load_weights", lambda: self.service.load_state(m, path, optimizer), m.model_id, 0)

    # ---- sampling -------------------------------------------------------------------------------------------------
    async def create_sampling_session(self, request: web.Request) -> web.Response:
        body = await request.json()
        seq = body.get("sampling_session_seq_id")
        seq = None if seq is None else int(seq)
        if body.get("model_path"):
            sampler_id = await self.service.sampler_for_path(body["session_id"], seq, body["model_path"])
        else:
            base = self.service.check_base(body.get("base_model"))
            sampler_id = self.service.new_sampler(body["session_id"], seq, None, base)
        return web.json_response({"type": "create_sampling_session", "sampling_session_id": sampler_id})

    async def get_sampler(self, request: web.Request) -> web.Response:
        s = self.service.sampler(request.match_info["sampler_id"])
        return web.json_response({"sampler_id": s.sampler_id, "base_model": s.base_model,
                                  "model_path": s.model_path})

    async def asample(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not body.get("sampling_session_id"):
            raise UserError("asample without a sampling_session_id: create a sampling client first")
        sampler = self.service.sampler(body["sampling_session_id"])
        self.service.logprob_ask(body)  # an option the engines cannot answer: a 400 now, not a failed future
        n = int(body.get("num_samples", 1))
        ids = [f"{sampler.sampler_id}:{body.get('seq_id', 0)}:{i}" for i in range(n)]
        return self._future("sample", lambda: self.service.sample(sampler, body), sample_sequence_ids=ids)

    async def retrieve_future(self, request: web.Request) -> web.StreamResponse:
        request_id = (await request.json())["request_id"]
        try:
            outcome = await self.futures.retrieve(request_id)
        except KeyError:  # 410: the SDK's samplers submit the request again; 404 would be fatal to it
            return detail(410, f"request {request_id!r} is not known to this server (it restarted, or the result "
                               "was collected long ago): submit it again")
        if outcome is None:
            state = {"queue_state": "paused_capacity", "queue_state_reason": f"{self.futures.pending} operations "
                     "pending on this server (api.max_pending_ops)"} if self.futures.full else {"queue_state": "active"}
            return web.json_response({"type": "try_again", "request_id": request_id, **state})
        if outcome.error is not None:
            return web.json_response({"error": outcome.error, "category": outcome.category})
        if outcome.proto is not None:
            return web.Response(body=outcome.proto, content_type="application/x-protobuf")
        return web.Response(text=json.dumps(outcome.json), content_type="application/json")
