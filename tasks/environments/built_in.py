"""The built-in environments by name, and the check that a config's params make one (a typo fails at load time).

The config's validator (tasks/environments/config.py) and the catalogue that builds environments
(tasks/environments/catalog.py) both read this table.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from tasks.environments.guessing import GuessingGame
from tasks.environments.tool_countdown import ToolCountdown

BUILT_IN: dict[str, type[BaseModel]] = {"tool_countdown": ToolCountdown, "guessing": GuessingGame}


def check_params(name: str, params: dict[str, Any]) -> BaseModel:
    """The built-in `name` made from `params`; bad params -> ValueError naming the field."""
    try:
        return BUILT_IN[name](**params)
    except ValidationError as exc:
        problems = "; ".join(f"environment.params.{'.'.join(map(str, e['loc'])) or '?'}: {e['msg']}"
                             for e in exc.errors())
        raise ValueError(f"{name}: {problems}") from None
