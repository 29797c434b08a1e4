"""The run's key on every route of an engine server but its health check: an ASGI middleware.

vLLM's own `--api-key` middleware (vllm/entrypoints/serve/middleware/authenticate.py, 0.32) checks only paths under
/v1, /v2, /inference and /cohere: `POST /invocations` (full inference), `/tokenize`, `/detokenize`,
`DELETE /adapters/{name}` (unloads the served adapter), `/metrics`, `/version`, `/openapi.json` answered anyone.
This one refuses every HTTP request and websocket without `Authorization: Bearer KEY`, whatever its path or method,
except `GET /health` (our start-up and liveness checks, and Ray's, call it without a key; it says only "ok").

The key comes from the environment variable AHA_ENGINE_KEY (rollout/server_process.py sets it), never the command
line: a process's /proc/PID/cmdline is readable by every local user, its /proc/PID/environ only by its own user.

Loaded by vLLM as `--middleware aha_engine_key.RequireKey` (rollout/vllm_server.py) and by the SGLang-JAX server's
app (rollout/sglang_jax_engine/app.py). Standard library only: it runs in either engine's env.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

KEY_ENV = "AHA_ENGINE_KEY"
OPEN = (("GET", "/health"), ("HEAD", "/health"))
"""(method, path) pairs that answer without the key."""
REFUSAL = json.dumps({"error": {"message": "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                                "code": 401}}).encode()


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class RequireKey:
    """Pure ASGI middleware: 401 for an HTTP request, a closed websocket (403) for a websocket, without the key."""

    def __init__(self, app, key: str | None = None) -> None:
        key = key if key is not None else os.environ.get(KEY_ENV)
        if not key:
            raise RuntimeError(f"aha_engine_key.RequireKey: no key given and ${KEY_ENV} is unset or empty")
        self.app = app
        self._key = _digest(key)

    def _allowed(self, scope) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", "") or "") or "/"
        if (scope.get("method"), path) in OPEN:
            return True
        given = b""
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                given = value
                break
        scheme, _, token = given.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()), self._key)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
        else:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(REFUSAL)).encode()),
                                    (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": REFUSAL})
