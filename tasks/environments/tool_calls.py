"""Tool calls in the model's own format: describe the tools in the prompt, find the calls in a turn, run them.

Two formats, chosen per environment (`tool_format`):
- `hermes`: `<tool_call>{"name": "calculator", "arguments": {"expression": "3 + 4"}}</tool_call>`, the format of
  Hermes, Qwen2.5/3 and SmolLM's chat templates (one JSON object per block; a list of objects is accepted too);
- `tags`: `<calculator>3 + 4</calculator>`, the tool's name as the tag around its one argument: far fewer tokens to
  get right for a small model that has never seen JSON tool calls.
A turn's calls are found with plain string search and `json.loads` (never `eval`), bounded in length. A malformed
call is not dropped: it comes back as a `ToolCall` with an `error`, which the environment answers with the error so
the model can learn what went wrong. A block whose closing tag was cut by a stop string (the format's stop strings
end the turn there, so the model does not write the result itself) is read to the end of the turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tasks.environments.base import Message

MAX_CALL_CHARS = 2000
"""Longest tool-call block read; a longer one is an error (model output is hostile)."""
MAX_CALLS = 4
"""Most calls run per turn; the rest are answered with an error."""

ToolFormat = Literal["hermes", "tags"]


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: one string argument, a plain function returning the result's text."""

    name: str
    description: str
    argument: str
    """Name of its one argument (e.g. "expression")."""
    fn: Callable[[str], str]
    """Runs the call; raise ValueError with a message for the model when the argument is bad."""


@dataclass(frozen=True)
class ToolCall:
    """One call found in a turn."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """Why the call could not be read (then name and arguments may be empty)."""


def describe(tools: Sequence[Tool], fmt: ToolFormat) -> str:
    """How to call `tools`, for the system prompt."""
    if fmt == "tags":
        lines = [f"- <{t.name}>{t.argument.upper()}</{t.name}>: {t.description}" for t in tools]
        return ("You can call these tools by writing the tag with the argument inside; the result comes back in the "
                "next message:\n" + "\n".join(lines))
    schemas = [{"name": t.name, "description": t.description,
                "parameters": {"type": "object", "properties": {t.argument: {"type": "string"}},
                               "required": [t.argument]}} for t in tools]
    return ("You can call tools. The tools are:\n<tools>\n" + "\n".join(json.dumps(s) for s in schemas) +
            "\n</tools>\nTo call one, write <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>; the "
            "result comes back in the next message.")


def stop_strings(tools: Sequence[Tool], fmt: ToolFormat) -> list[str]:
    """Strings that end the model's turn right after a call (so it waits for the result)."""
    return [f"</{t.name}>" for t in tools] if fmt == "tags" else ["</tool_call>"]


def parse(text: str, tools: Sequence[Tool], fmt: ToolFormat) -> list[ToolCall]:
    """Every call in `text`, in order (empty: the turn calls no tool)."""
    if fmt == "tags":
        return [call for t in tools for call in _tag_calls(text, t)]
    return [call for block in _blocks(text, "tool_call") for call in _hermes_calls(block)]


def _blocks(text: str, tag: str) -> list[str]:
    """Contents of `<tag>...</tag>` blocks; an unclosed last block runs to the end of the text."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    out, pos = [], 0
    while (start := text.find(open_tag, pos)) >= 0:
        start += len(open_tag)
        end = text.find(close_tag, start)
        out.append(text[start:] if end < 0 else text[start:end])
        if end < 0:
            break
        pos = end + len(close_tag)
    return out


def _tag_calls(text: str, tool: Tool) -> list[ToolCall]:
    calls = []
    for block in _blocks(text, tool.name):
        if len(block) > MAX_CALL_CHARS:
            calls.append(ToolCall(tool.name, error=f"argument longer than {MAX_CALL_CHARS} characters"))
        else:
            calls.append(ToolCall(tool.name, {tool.argument: block.strip()}))
    return calls


def _hermes_calls(block: str) -> list[ToolCall]:
    if len(block) > MAX_CALL_CHARS:
        return [ToolCall("", error=f"tool call longer than {MAX_CALL_CHARS} characters")]
    try:
        value = json.loads(block)
    except json.JSONDecodeError as exc:
        return [ToolCall("", error=f"tool call is not valid JSON ({exc.msg} at character {exc.pos})")]
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            calls.append(ToolCall("", error='a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        arguments = item.get("arguments", {})
        if isinstance(arguments, str):  # some models send the arguments JSON-encoded a second time
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append(ToolCall(item["name"], error="arguments must be a JSON object"))
            continue
        calls.append(ToolCall(item["name"], arguments))
    return calls


def run_calls(calls: Sequence[ToolCall], tools: Sequence[Tool]) -> list[Message]:
    """Each call's result (or error) as a tool message, in order; at most MAX_CALLS are run."""
    by_name = {t.name: t for t in tools}
    messages = []
    for index, call in enumerate(calls):
        messages.append({"role": "tool", "name": call.name or "unknown", "content": _result(call, by_name, index)})
    return messages


def _result(call: ToolCall, by_name: dict[str, Tool], index: int) -> str:
    if index >= MAX_CALLS:
        return f"error: at most {MAX_CALLS} tool calls per turn"
    if call.error is not None:
        return f"error: {call.error}"
    tool = by_name.get(call.name)
    if tool is None:
        return f"error: no tool named {call.name[:40]!r}; the tools are {sorted(by_name)}"
    argument = call.arguments.get(tool.argument)
    if not isinstance(argument, str):
        argument = None if argument is None else str(argument)
    if argument is None:
        return f"error: {tool.name} needs the argument {tool.argument!r}"
    try:
        return tool.fn(argument)
    except ValueError as exc:
        return f"error: {exc}"
