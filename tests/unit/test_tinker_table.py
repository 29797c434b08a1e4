"""docs/tinker.md's "What is served" table against the pinned SDK (tinker 0.38): every public method of its four
clients is listed there with what this server does with it, and every `Client.method` the table names exists.

A new SDK method (or a row naming a method the SDK dropped) fails this test until the table says what happens to it.
Fails on main at fe1415a (ServiceClient.create_custom_loss / get_console_url, TrainingClient.load_state,
SamplingClient.get_base_model, RestClient.get_sampler / whoami / get_audit_log / get_billing_usage /
get_current_checkpoint_storage_usage and the client-side helpers had no row)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import tinker

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = {c.__name__: c for c in (tinker.ServiceClient, tinker.TrainingClient, tinker.SamplingClient,
                                   tinker.RestClient)}


def sdk_methods() -> dict[str, set[str]]:
    """Each client's public methods, an `_async` twin folded into its name (the table lists a call once)."""
    return {name: {m.removesuffix("_async") for m, v in inspect.getmembers(cls)
                   if not m.startswith("_") and callable(v)} for name, cls in CLIENTS.items()}


def table_rows() -> list[tuple[str, str]]:
    """(first cell, second cell) of each row of the "What is served" table."""
    text = (ROOT / "docs" / "tinker.md").read_text()
    section = text.split("## What is served", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")] if line.startswith("| ") else []
        if len(cells) == 2 and cells[0] != "SDK call":
            rows.append((cells[0], cells[1]))
    return rows


def named_calls(cell: str) -> set[tuple[str | None, str]]:
    """(client or None, method) of every call a first cell names in backticks: `Client.m(...)` or `m(...)`."""
    out = set()
    for span in re.findall(r"`([^`]+)`", cell):
        if m := re.fullmatch(r"(?:(\w+)\.)?(\w+)", span.split("(", 1)[0].strip()):
            out.add((m.group(1), m.group(2)))
    return out


def test_the_sdk_version_is_the_one_the_table_describes():
    assert tinker.__version__.startswith("0.38."), f"tinker {tinker.__version__}: re-read the SDK and the table"


def test_every_public_sdk_method_has_a_row_saying_what_happens_to_it():
    rows = table_rows()
    assert len(rows) > 10, "the table of docs/tinker.md was not found"
    listed = {call: why for cell, why in rows for call in named_calls(cell)}
    missing = []
    for client, methods in sdk_methods().items():
        for method in sorted(methods):
            why = listed.get((client, method)) or listed.get((None, method))
            if not why or len(why) < 20:
                missing.append(f"{client}.{method}")
    assert not missing, f"docs/tinker.md's table does not say what happens to: {', '.join(missing)}"


def test_every_client_method_the_table_names_is_in_the_sdk():
    methods = sdk_methods()
    stale = sorted(f"{client}.{method}" for cell, _ in table_rows() for client, method in named_calls(cell)
                   if client in CLIENTS and method not in methods[client])
    assert not stale, f"docs/tinker.md names calls tinker {tinker.__version__} does not have: {stale}"
