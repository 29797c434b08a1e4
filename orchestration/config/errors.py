"""A config mistake as one readable line per problem: the error type, pydantic's errors rewritten with the key path,
and the closest real key for an unknown one ("did you mean learner.optimizer.lr?")."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config mistake, already formatted as one line per problem."""


def leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted leaf path of a config tree (`learner.optimizer.lr`, ...); a union contributes each member's."""
    paths = []
    for name, info in model.model_fields.items():
        args = getattr(info.annotation, "__args__", None) or (info.annotation,)
        submodels = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        paths += [p for m in submodels for p in leaf_paths(m, f"{prefix}{name}.")] or [f"{prefix}{name}"]
    return sorted(set(paths))


def _user_paths(loc: tuple, value: Any) -> list[str]:
    """The dotted paths a user wrote at an unknown key: the key itself, or the leaves under it if it is a section."""
    base = ".".join(str(p) for p in loc if not isinstance(p, int))  # list positions (rewards.terms.0) are no key
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in _user_paths((*loc, k), v)]
    return [base]


def _closeness(wrote: str, leaf: str) -> float:
    # Half the last name (`lrr` ~ `lr`), half the whole path (`rolout.sampling.n` ~ `rollout.sampling.n`): the name
    # alone ties across sections, the path alone prefers a sibling with a long shared prefix over the right leaf.
    # A name cut short (`gpu_mem` of gpu_memory_utilization) counts as close.
    short, full = wrote.rsplit(".", 1)[-1], leaf.rsplit(".", 1)[-1]
    name = 0.9 if len(short) >= 3 and full.startswith(short) else difflib.SequenceMatcher(None, short, full).ratio()
    return 0.5 * name + 0.5 * difflib.SequenceMatcher(None, wrote, leaf).ratio()


def _did_you_mean(loc: tuple, value: Any) -> str:
    """Suggest the closest leaf of the whole RunConfig tree for an unknown key (`learner.lrr` -> learner.optimizer.lr)."""
    from orchestration.config.schema import RunConfig  # the schema imports nothing of this module

    leaves = leaf_paths(RunConfig)
    best = []
    for wrote in _user_paths(loc, value):
        score, leaf = max((_closeness(wrote, leaf), leaf) for leaf in leaves)
        if score >= 0.6 and leaf not in best:
            best.append(leaf)
    return f"; did you mean {' / '.join(best[:3])}?" if best else ""


def format_validation_error(err: ValidationError) -> str:
    """One line per problem: `learner.optimizer.lr: Input should be greater than 0 (got -1)`."""
    lines = []
    for entry in err.errors():
        loc = tuple(p for p in entry["loc"] if not (isinstance(p, str) and p in {"vllm", "sglang_jax"}))
        path = ".".join(str(p) for p in loc) or "<root>"
        if entry["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key{_did_you_mean(loc, entry['input'])}")
            continue
        msg = entry["msg"].removeprefix("Value error, ")
        got = f" (got {entry['input']!r})" if entry["type"] != "missing" and not isinstance(entry["input"], dict) else ""
        # A validator's message that already starts with the full key path is not prefixed twice.
        lines.append(f"{path}: {msg}{got}" if loc and not msg.startswith(f"{path}.") else msg)
    return "\n".join(lines)


def error_report(err: Exception, prefix: str = "config error") -> str:
    """What a CLI prints for a ConfigError: one line for one problem; for several (ConfigError lists them all),
    a count line, then a line per problem. Every CLI (train, preflight, serve, eval) prints it the same way."""
    problems = str(err).splitlines()
    if len(problems) == 1:
        return f"{prefix}: {problems[0]}"
    return "\n".join([f"{prefix}: {len(problems)} problems:", *problems])
