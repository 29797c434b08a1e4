"""Seconds this process has spent making XLA programs: tracing, lowering and compiling (or loading from JAX's
persistent cache), summed from JAX's own monitoring events.

A step's `learner/compile_s` is this total's growth over the step: a step that met a new shape shows it, so a
slow step reads as "compiled" rather than as a slow update, and a benchmark can tell the loop's overlap from
compiles (bench/bench_loop.py).
"""

from __future__ import annotations

import threading

from jax import monitoring

# jax/_src/dispatch.py's event names (JAX 0.12): the three stages from a Python function to a program.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")

_lock = threading.Lock()
_total = 0.0
_registered = False


def _on_duration(event: str, seconds: float, **_: object) -> None:
    global _total
    if event in COMPILE_EVENTS:
        with _lock:
            _total += seconds


def compile_seconds() -> float:
    """Seconds spent tracing, lowering and compiling in this process since the first call."""
    global _registered
    with _lock:
        if not _registered:
            monitoring.register_event_duration_secs_listener(_on_duration)
            _registered = True
        return _total
