"""`Prompt`: one row of the problem side as the loop, the rewards and the evals see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One prompt, rendered for the configured template, with what its reward needs."""

    uid: str
    """Stable id, e.g. "countdown-train-000123"."""
    task: str
    """"countdown" | "math" | "dataset"."""
    messages: tuple[dict[str, Any], ...] | None
    """Chat template input (role/content) when the template is chat."""
    text: str | None
    """Raw prompt text when the template is base."""
    reference: dict[str, Any]
    """What the rewards read: countdown {"numbers", "target", "solution"}; math {"answer"}; dataset: the row's other
    columns."""
    raw: Any = None
    """The prompt as the data row holds it (text, or a list of chat messages), which a reward by import path gets as
    TRL's `prompts`; None: the rendered messages or text (generated tasks)."""

    @property
    def as_data(self) -> Any:
        """The prompt in TRL's terms: the row's text or message list, else the rendered messages or text."""
        if self.raw is not None:
            return self.raw
        return [dict(m) for m in self.messages] if self.messages is not None else self.text
