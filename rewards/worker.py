"""One reward worker process: `python -m rewards.worker FD`, started and fed by rewards/pool.py.

It imports the user's reward functions and runs one call at a time, with TRL's signature
`f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns)`. A user's scorer of
hostile model output may raise, hang, exit, eat memory, fork or daemonise; here that costs this process only.
Before it imports any of it, the worker confines itself (rewards/confinement.py): it joins the pool's container,
so all it starts can be killed with it; caps memory, tasks, file size and open files; runs as an unprivileged
user when started as root; and dies with the driver (PR_SET_PDEATHSIG), even when a call holds the GIL in C code.
Nothing it is given names the driver's PID (its pool token is random). Its replies are JSON (numbers, None, short
strings): the driver never unpickles what user code could shape. stdout goes to stderr, which the pool reads (a
stray print lands in the run's log, a flood is cut), and SIGINT is ignored (the driver owns Ctrl-C). A forked copy of the worker that returns from a
reward exits without a word, so only the worker answers. The driver enforces the per-call timeout by killing the
worker's container, and replaces a worker that died.
"""

from __future__ import annotations

import asyncio
import decimal
import importlib
import inspect
import json
import math
import numbers
import os
import signal
import sys
from collections.abc import Iterable, Mapping, Set
from multiprocessing.connection import Connection
from typing import Any

from rewards.confinement import confine

MAX_MESSAGE_CHARS = 300


def main() -> None:
    parent = os.getppid()
    conn = Connection(int(sys.argv[1]))
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        init = conn.recv()  # from the driver, before any user code runs: trusted
        sys.path[:0] = [p for p in init["sys_path"] if p not in sys.path]
        confine(init, parent)
        serve(conn, init)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the pool closed (or gave up on this worker): done
        return


def serve(conn: Connection, init: dict) -> None:
    """Import the functions, say so, then answer calls until the pool closes the pipe."""
    me = os.getpid()

    def answer(**fields) -> None:
        if os.getpid() != me:  # a copy that user code forked, back in our code: only the worker answers
            os._exit(0)
        conn.send_bytes(_reply(**fields))

    fns = {}
    for index, path in init["fns"].items():
        try:
            fns[index] = load(path)
        except BaseException as exc:  # noqa: BLE001 - reported to the driver as a config error, whatever it is
            answer(import_error=index, message=_describe(exc))
            return
    answer(ready=True)
    while True:
        call_id, index, kwargs = conn.recv()
        reply, fatal = run_call(fns[index], kwargs)
        answer(id=call_id, **reply)
        if fatal:  # after a MemoryError the process may be half-broken: let the pool start a fresh one
            return


def load(path: str) -> Any:
    """The object at `package.module:attr.attr`."""
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path} is a {type(obj).__name__}, not a function")
    return obj


def run_call(fn, kwargs: dict) -> tuple[dict, bool]:
    """({"values": [...], "metrics": {...}} or {"kind": ..., "message": ...}, whether the process must end)."""
    size = len(kwargs["completions"])
    logged: dict[str, list[float]] = {}

    def log_metric(name: str, value: float) -> None:
        logged.setdefault(str(name)[:64], []).append(float(value))

    def log_extra(column: str, values: list) -> None:  # TRL's completions-table column: aha keeps no such table
        return None

    try:
        out = fn(**kwargs, log_metric=log_metric, log_extra=log_extra)
        if inspect.isawaitable(out):
            out = asyncio.run(_wait(out))
        values, problem = check_values(out, size)
    except MemoryError:
        return {"kind": "memory", "message": "MemoryError (rewards.pool.memory_mb reached)"}, True
    except Exception as exc:  # noqa: BLE001 - a buggy scorer is reported per call; SystemExit ends the process
        return {"kind": "raised", "message": _describe(exc)}, False
    if problem:
        return {"kind": "invalid", "message": problem}, False
    metrics = {name: sum(v) / len(v) for name, v in logged.items() if all(math.isfinite(x) for x in v)}
    return {"values": values, "metrics": metrics}, False


async def _wait(awaitable):
    return await awaitable


def check_values(out: Any, size: int) -> tuple[list[float | None], str | None]:
    """The call's rewards as floats or None, or a problem line: what TRL's GRPOTrainer takes, scored as it scores it.

    TRL (`_calculate_rewards`) iterates the result, turns None into NaN and hands the list to
    `torch.tensor(..., dtype=float32)`, stored as one column of the batch's rewards; NaN is left out of the sum
    (nansum). So it takes any flat iterable of one number per completion: a list, tuple, generator, range,
    array.array, a 1-D numpy array or pandas Series or torch tensor, of ints, floats, bools, numpy or torch
    scalars, Fractions, Decimals, or None/NaN; and it fails on a scalar, a string, complex numbers, nested lists
    or an (N, 1) array, and on 0-d numpy arrays inside a list. Here those fail too, as `invalid` with this line.
    Refused as well, though TRL lets them through by accident: a dict or set (TRL iterates its keys), bytes (their
    byte values), one value or a (1, N) array for N completions (broadcast to all), and an infinity (TRL's
    advantages turn NaN). Values stay float64 (TRL rounds to float32)."""
    if isinstance(out, (str, bytes, bytearray, Mapping, Set)) or not isinstance(out, Iterable):
        return [], f"returned {type(out).__name__}, not one number (or None) per completion ({size})"
    ndim = getattr(out, "ndim", 1)
    if ndim != 1:
        return [], f"returned a {ndim}-dimensional {type(out).__name__}, not a flat sequence of {size} numbers"
    try:
        items = list(out)
    except TypeError as exc:
        return [], f"returned {type(out).__name__} that cannot be iterated ({exc})"
    if len(items) != size:
        return [], f"returned {len(items)} values for {size} completions"
    values: list[float | None] = []
    for i, item in enumerate(items):
        value, problem = _number(item)
        if problem:
            return [], f"value {i} is {type(item).__name__} {str(item)[:40]!r}: {problem}"
        values.append(value)
    return values, None


def _number(item: Any) -> tuple[float | None, str | None]:
    """One reward as TRL's float32 tensor reads it: (the value, None for None/NaN) or (None, what is wrong)."""
    if item is None:
        return None, None
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(item, numpy.ndarray):  # torch.tensor refuses these inside a list
        return None, "a numpy array, not a number or None (return value.item())"
    if not isinstance(item, (numbers.Real, decimal.Decimal)) and getattr(item, "ndim", None) == 0 \
            and callable(getattr(item, "item", None)):  # a numpy scalar (np.bool_ too) or a 0-d torch tensor
        item = item.item()
    if not isinstance(item, (numbers.Real, decimal.Decimal)):
        return None, "not a number or None"
    try:
        value = float(item)
    except (OverflowError, ValueError) as exc:
        return None, str(exc)
    if math.isinf(value):
        return None, "an infinity (it would make the group's advantages NaN)"
    return (None if math.isnan(value) else value), None


def _describe(exc: BaseException) -> str:
    return repr(exc)[:MAX_MESSAGE_CHARS]


def _reply(**fields) -> bytes:
    return json.dumps(fields).encode()


if __name__ == "__main__":
    main()
