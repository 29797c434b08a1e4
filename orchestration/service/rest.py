"""The SDK's RestClient routes on `aha tinker`: training runs, checkpoints (list, delete, publish, TTL, weights
info), external weights downloads and sessions, over the records on the run directory (checkpoints.py).

`tinker checkpoint download` fetches each file of an external weights checkpoint from a signed URL with plain
`urllib` (no API key): `external_weights_urls` answers URLs to this server's own `checkpoint_files` route, signed
with an HMAC of the server's key over the file and an expiry time, so the files route takes the signature instead
of the key and a URL works only for its file until it expires. The URLs use the host and port the client reached
the server by (its TINKER_BASE_URL).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import time
from urllib.parse import quote

from aiohttp import web

from common.storage import file_sizes, read_bytes
from orchestration.service import paths
from orchestration.service.checkpoints import TYPES
from orchestration.service.futures import UserError
from orchestration.service.training import TinkerService

API = "/api/v1"
FILES = f"{API}/checkpoint_files/"  # the signed download route: no API key, the URL's signature instead
URL_LIFETIME_S = 3600
CHECKPOINT = f"{API}/training_runs/{{run_id}}/checkpoints/{{kind}}/{{name}}"


class RestRoutes:
    def __init__(self, service: TinkerService, api_key: str):
        self.service, self.records, self.key = service, service.records, api_key.encode()

    def add_to(self, app: web.Application) -> None:
        get, post, put, delete = (app.router.add_get, app.router.add_post, app.router.add_put,
                                  app.router.add_delete)
        get(f"{API}/training_runs", self.list_training_runs)
        get(f"{API}/training_runs/{{run_id}}", self.training_run)
        get(f"{API}/training_runs/{{run_id}}/checkpoints", self.list_checkpoints)
        get(f"{API}/checkpoints", self.list_user_checkpoints)
        delete(CHECKPOINT, self.delete_checkpoint)
        post(f"{CHECKPOINT}/publish", lambda r: self.set_public(r, True))
        delete(f"{CHECKPOINT}/publish", lambda r: self.set_public(r, False))
        put(f"{CHECKPOINT}/ttl", self.set_ttl)
        get(f"{CHECKPOINT}/external_weights_urls", self.external_weights_urls)
        get(f"{FILES}{{run_id}}/{{kind}}/{{name}}/{{file:.+}}", self.checkpoint_file)
        post(f"{API}/weights_info", self.weights_info)
        get(f"{API}/sessions", self.list_sessions)
        get(f"{API}/sessions/{{session_id}}", self.get_session)

    # ---- training runs and checkpoints ------------------------------------------------------------------------------
    async def list_training_runs(self, request: web.Request) -> web.Response:
        ids = list(reversed(await asyncio.to_thread(self.records.run_ids)))  # newest first
        offset, limit = page(request, 20)
        runs = [await asyncio.to_thread(self.service.training_run, i) for i in ids[offset:offset + limit]]
        return web.json_response({"training_runs": runs,
                                  "cursor": {"offset": offset, "limit": limit, "total_count": len(ids)}})

    async def training_run(self, request: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(self.service.training_run, request.match_info["run_id"]))

    async def list_checkpoints(self, request: web.Request) -> web.Response:
        rows = await asyncio.to_thread(self.records.checkpoints, request.match_info["run_id"])
        return web.json_response({"checkpoints": rows})

    async def list_user_checkpoints(self, request: web.Request) -> web.Response:
        rows = await asyncio.to_thread(self.records.all_checkpoints)
        offset, limit = page(request, 100)
        return web.json_response({"checkpoints": rows[offset:offset + limit],
                                  "cursor": {"offset": offset, "limit": limit, "total_count": len(rows)}})

    async def delete_checkpoint(self, request: web.Request) -> web.Response:
        await asyncio.to_thread(self.records.delete, checkpoint_path(request))
        return web.json_response({})

    async def set_public(self, request: web.Request, public: bool) -> web.Response:
        await asyncio.to_thread(self.records.set_public, checkpoint_path(request), public)
        return web.json_response({})

    async def set_ttl(self, request: web.Request) -> web.Response:
        ttl = (await request.json()).get("ttl_seconds")
        await asyncio.to_thread(self.records.set_ttl, checkpoint_path(request), ttl)
        return web.json_response({})

    async def weights_info(self, request: web.Request) -> web.Response:
        path = paths.parse(str((await request.json()).get("tinker_path")), tuple(TYPES))
        await asyncio.to_thread(self.records.checkpoint, path)  # a 404 for a checkpoint deleted or expired
        run = await asyncio.to_thread(self.service.training_run, path.model_id)
        return web.json_response({"base_model": run["base_model"], "is_lora": True, "lora_rank": run["lora_rank"],
                                  **{k: run.get(k) for k in ("train_unembed", "train_mlp", "train_attn")}})

    # ---- external weights downloads ---------------------------------------------------------------------------------
    async def external_weights_urls(self, request: web.Request) -> web.Response:
        path = checkpoint_path(request)
        if path.kind != "external_weights":
            raise UserError(f"{path}: signed URLs are for external weights (save_weights_external) only")
        await asyncio.to_thread(self.records.checkpoint, path)
        files = await asyncio.to_thread(file_sizes, path.location(self.service.root))
        expires = int(time.time()) + URL_LIFETIME_S
        origin = f"{request.scheme}://{request.host}"
        urls = {name: f"{origin}{self._signed(path, name, expires)}" for name in files}
        return web.json_response({"urls": urls, "expires": dt.datetime.fromtimestamp(
            expires, dt.timezone.utc).isoformat()})

    def _signed(self, path: paths.TinkerPath, name: str, expires: int) -> str:
        route = f"{FILES}{path.model_id}/{path.kind}/{path.name}/{quote(name)}"
        return f"{route}?expires={expires}&signature={self._signature(path, name, expires)}"

    def _signature(self, path: paths.TinkerPath, name: str, expires: int) -> str:
        return hmac.new(self.key, f"{path}/{name}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def signed(self, request: web.Request) -> bool:
        """Whether a files request carries an unexpired signature of its own file (the guard's test for it)."""
        info = request.match_info
        try:
            path = paths.TinkerPath(info["run_id"], info["kind"], info["name"])
            expires = int(request.query.get("expires", "0"))
        except (KeyError, ValueError):
            return False
        want = self._signature(path, info.get("file", ""), expires)
        return expires > time.time() and hmac.compare_digest(want, request.query.get("signature", ""))

    async def checkpoint_file(self, request: web.Request) -> web.Response:
        info = request.match_info
        path = paths.parse(f"{paths.SCHEME}{info['run_id']}/{info['kind']}/{info['name']}", ("external_weights",))
        name = info["file"]
        files = await asyncio.to_thread(file_sizes, path.location(self.service.root))
        if name not in files:  # never a path outside the checkpoint: only the names it holds
            raise KeyError(f"{path}/{name}")
        body = await asyncio.to_thread(read_bytes, f"{path.location(self.service.root)}/{name}")
        return web.Response(body=body, content_type="application/octet-stream")

    # ---- sessions -------------------------------------------------------------------------------------------------
    async def list_sessions(self, request: web.Request) -> web.Response:
        """This server's sessions, newest first, then those of earlier servers' training runs on the run dir."""
        runs = await asyncio.to_thread(self.records.run_ids)
        ids = list(reversed(self.service.sessions))
        ids += [s for s in dict.fromkeys(r.split(":")[0] for r in reversed(runs)) if s not in self.service.sessions]
        offset, limit = page(request, 20)
        return web.json_response({"sessions": ids[offset:offset + limit]})

    async def get_session(self, request: web.Request) -> web.Response:
        session_id = request.match_info["session_id"]
        runs = [r for r in await asyncio.to_thread(self.records.run_ids) if r.split(":")[0] == session_id]
        runs += [m for m in self.service.models if m.split(":")[0] == session_id and m not in runs]
        if not runs and session_id not in self.service.sessions:
            raise KeyError(f"session {session_id}")
        samplers = [s for s in self.service.samplers if s.split(":")[0] == session_id]
        return web.json_response({"training_run_ids": runs, "sampler_ids": samplers,
                                  "user_metadata": self.service.session_metadata.get(session_id)})


def checkpoint_path(request: web.Request) -> paths.TinkerPath:
    info = request.match_info
    return paths.parse(f"{paths.SCHEME}{info['run_id']}/{info['kind']}/{info['name']}", tuple(TYPES))


def page(request: web.Request, default_limit: int) -> tuple[int, int]:
    """(offset, limit) of a listing: the SDK's query parameters."""
    try:
        offset, limit = int(request.query.get("offset", 0)), int(request.query.get("limit", default_limit))
    except ValueError:
        raise UserError(f"offset and limit must be integers (got {dict(request.query)})") from None
    if offset < 0 or limit < 0:
        raise UserError(f"offset {offset} and limit {limit} must be >= 0")
    return offset, limit

