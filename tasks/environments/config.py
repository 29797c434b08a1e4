"""EnvironmentConfig: which environment plays the episodes, its parameters, and the limits of one episode."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, model_validator

from common.strict import Strict
from tasks.environments.built_in import BUILT_IN, check_params

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class EnvironmentConfig(Strict):
    """A multi-turn environment (`environment:`): set, every sample is an episode of model turns and environment
    replies; unset, a sample is one completion (single-turn)."""

    name: str
    """A built-in (`tool_countdown`, `guessing`), `verifiers` (an environment written for verifiers 0.4, its
    `[env]` block in params), or an import path `package.module:Name` of your own class or factory."""
    params: dict[str, Any] = {}
    """Keyword arguments of the environment (built-ins: see tasks/environments/; verifiers: {"env": {...}})."""
    max_turns: int = Field(4, ge=1)
    """Most model turns per episode; the episode ends after the last one's reply is scored."""
    max_episode_tokens: int = Field(512, ge=8)
    """Most tokens after the opening prompt (model turns and environment replies together); a turn's max_tokens is
    cut to what is left, and a reply that does not fit ends the episode."""
    step_timeout_s: float = Field(30.0, gt=0)
    """Most seconds one environment step (or opening, or close) may take; a slower one ends its episode as an
    error (scored per rewards.on_error)."""

    @model_validator(mode="after")
    def _check(self) -> EnvironmentConfig:
        if self.name not in BUILT_IN and self.name != "verifiers" and not IMPORT_PATH.match(self.name):
            raise ValueError(f"environment.name {self.name!r}: use one of {sorted(BUILT_IN)}, 'verifiers', or an "
                             "import path 'package.module:Name'")
        if self.name in BUILT_IN:
            check_params(self.name, self.params)  # a typo in params fails at load time, not at the first step
        return self
