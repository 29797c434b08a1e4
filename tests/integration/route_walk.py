"""Walk every route of an engine server without its key and with a wrong one; find who holds the key in /proc.

Used in-process by tests/integration/test_rollout_lora.py, and as a program from another network namespace by
tests/integration/test_multinode.py:

    ROUTE_WALK_KEY=KEY python tests/integration/route_walk.py URL MODEL     # prints walk()'s JSON

The key goes by the environment, as it does to the engine: a command line is readable by every local user.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx

KEY_ENV = "ROUTE_WALK_KEY"
UNLISTED = [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/docs/oauth2-redirect")]
"""FastAPI's own routes, which its OpenAPI document does not list."""
OPEN = {"GET /health"}
"""The only route that may answer without the key."""


def walk(url: str, key: str, model: str, wait_s: float = 600) -> dict:
    """{"routes": {"METHOD /path": [status without a key, status with a wrong key]}, "health": status without a key,
    "models": and "completion": status with the right key}. Every method of every path the server's OpenAPI lists
    (read with the key) and FastAPI's unlisted documentation routes; a path parameter gets any value."""
    right = {"Authorization": f"Bearer {key}"}
    # A connection per request: the quick tier at f34007b had one request of the walk reset ("Connection reset by
    # peer") on a loaded box, not reproduced since; a kept-alive connection the server closes after its idle timeout
    # (uvicorn's 5 s) as the client reuses it is the likeliest cause, and a fresh connection cannot meet it.
    with httpx.Client(base_url=url, timeout=60, headers={"Connection": "close"}) as client:
        deadline = time.monotonic() + wait_s
        while True:  # the engine may still be starting
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}/health did not answer 200 within {wait_s:.0f} s")
            time.sleep(0.5)
        listed = client.get("/openapi.json", headers=right)
        listed.raise_for_status()
        routes = sorted({(method.upper(), path) for path, ops in listed.json()["paths"].items() for method in ops
                         if method.upper() in ("GET", "POST", "PUT", "PATCH", "DELETE")} | set(UNLISTED))
        out: dict = {"routes": {}}
        for method, path in routes:
            if f"{method} {path}" in OPEN:
                continue
            concrete = path.replace("{", "x").replace("}", "")
            out["routes"][f"{method} {path}"] = [client.request(method, concrete, headers=headers).status_code
                                                for headers in ({}, {"Authorization": "Bearer wrong" + key})]
        out["health"] = client.get("/health").status_code
        out["models"] = client.get("/v1/models", headers=right).status_code
        out["completion"] = client.post("/v1/completions", headers=right,
                                        json={"model": model, "prompt": "1 + 1 =", "max_tokens": 1}).status_code
    return out


def open_routes(result: dict) -> dict[str, list[int]]:
    """The routes of a walk that did not refuse both requests (401 or 403; 404 for a route not mounted)."""
    return {route: codes for route, codes in result["routes"].items()
            if not all(code in (401, 403, 404) for code in codes)}


def key_holders(key: str) -> tuple[list[int], list[int]]:
    """(pids whose environment holds `key`, pids whose command line holds it), over every process of this host's
    /proc that this user can read."""
    in_env, in_argv = [], []
    needle = key.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                in_argv.append(int(entry.name))
            if needle in (entry / "environ").read_bytes():
                in_env.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return in_env, in_argv


if __name__ == "__main__":
    print(json.dumps(walk(sys.argv[1], os.environ[KEY_ENV], sys.argv[2])))
