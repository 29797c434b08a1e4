"""The environment catalogue: built-in names, the verifiers adapter, import paths; where each runs; and where a run's
rows come from.

Built-ins are pydantic models whose fields are `environment.params`, so a typo is a config error at load time.
`verifiers` and import paths are imported only when a run sets them up (verifiers alone takes ~15 s to import).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tasks.config import DataConfig
from tasks.dataset import setup_dataset
from tasks.prompt import Prompt
from tasks.environments.base import Environment, own_rows
from tasks.environments.built_in import BUILT_IN, check_params

if TYPE_CHECKING:
    from tasks.environments.config import EnvironmentConfig


def setup_environment(cfg: EnvironmentConfig) -> Environment:
    """The environment a run's episodes are played in: the verifiers adapter in the driver's event loop (its episodes
    are coroutines, cancelled at the timeout), any other with each episode in a process of its own
    (tasks/environments/host.py), so that a call that never returns is killed at the timeout."""
    environment = build_environment(cfg)  # here too: an import error or a bad factory fails the run in seconds
    if cfg.name == "verifiers":
        return environment
    from tasks.environments.host import HostedEnvironment

    return HostedEnvironment(cfg, environment)


def build_environment(cfg: EnvironmentConfig) -> Environment:
    """The environment object itself, in this process (the host process builds its own with this)."""
    if cfg.name in BUILT_IN:
        return check_params(cfg.name, cfg.params)  # type: ignore[return-value]
    if cfg.name == "verifiers":
        from tasks.environments.verifiers_adapter import VerifiersEnvironment

        return VerifiersEnvironment(**cfg.params)
    module_name, _, attr = cfg.name.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"environment.name {cfg.name!r} cannot be imported ({exc}); put its package on PYTHONPATH "
                         "or in the run's working directory") from None
    environment = factory(**cfg.params)
    if not isinstance(environment, Environment):
        raise ValueError(f"environment.name {cfg.name!r} made a {type(environment).__name__}, which has no "
                         "episode(row) method (tasks/environments/base.py says what an environment is)")
    return environment


def environment_rows(data: DataConfig, environment: Environment | None, split: str) -> list[Prompt]:
    """The rows of `split`: the environment's own, else `data.task`'s."""
    rows = None if environment is None else own_rows(environment, data, split)
    return setup_dataset(data, split) if rows is None else rows  # type: ignore[arg-type]
