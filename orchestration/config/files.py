"""A run config from and to YAML: read a file, apply `a.b.c=value` overrides, validate into a RunConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestration.config.schema import RunConfig
from orchestration.config.errors import ConfigError, format_validation_error

T = TypeVar("T", bound=BaseModel)


def _parse_scalar(text: str) -> Any:
    # YAML rules for override values, so `lr=1e-5`, `x=true`, `stop=["a","b"]` and `name=null` behave as in files.
    return yaml.safe_load(text)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` overrides to a nested dict (creating missing levels)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. learner.optimizer.lr=1e-5)")
        key, value = item.split("=", 1)
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_scalar(value)
    return raw


def load_config(path: str | Path, overrides: list[str] | None = None, schema: type[T] = RunConfig) -> T:
    """Read YAML, apply dotted overrides, validate (into a RunConfig, or `schema`). Raises ConfigError with
    readable lines."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} not found (shipped configs are in configs/)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections (model, rollout, learner, ...)")
    raw = apply_overrides(raw, overrides or [])
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def dump_config(cfg: BaseModel, path: Path) -> None:
    """Write the resolved config (every default filled in) so a run can be resumed or reproduced from it."""
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
