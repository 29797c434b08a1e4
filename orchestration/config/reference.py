"""The config reference, generated from the pydantic models: every key with its type, default and docstring.

    .venv/bin/python -m orchestration.config.reference           # print it (Markdown)
    .venv/bin/python -m orchestration.config.reference --write   # regenerate docs/config.md
    aha train --help-config                                      # the same text, from the CLI

It walks `RunConfig` as it is at run time, so a key or a section added anywhere in the tree appears with no edit
here: a field whose type holds pydantic models (a union of engines, a list of reward terms) is a section of its
own, every other field is a row. Descriptions are the field docstrings (`common.strict.STRICT`, the one config of every model and
reward dataclass, turns them into field descriptions).
tests/unit/test_config_reference.py keeps docs/config.md equal to this output and every field documented.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import json
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"
REGENERATE = ".venv/bin/python -m orchestration.config.reference --write"
HEADER = f"""# Config reference

Every key of a run config, generated from the pydantic models' field docstrings by
`{REGENERATE}` (do not edit by hand: `tests/unit/test_config_reference.py` fails when this file
and the models differ; `aha train --help-config` prints the same).
A config is YAML with these sections; any key can be overridden on the command line as `section.key=value`
(e.g. `learner.optimizer.lr=1e-5`). Unknown keys are errors, with a did-you-mean.
"""


@dataclass
class Row:
    key: str
    type: str
    default: str
    doc: str
    see: str = ""
    """Links to the sections a field of models opens."""


@dataclass
class Section:
    path: str
    """Dotted path of the section (`rollout.backend`); `[]` marks a list's items (`rewards.terms[]`)."""
    variant: str
    """For one member of a union of models: which (`kind: vllm`); else ''."""
    model: type[BaseModel]
    rows: list[Row]


def sections(model: type[BaseModel], path: str = "", variant: str = "") -> list[Section]:
    """The model's own section, then its subsections depth first, in field order."""
    own = Section(path, variant, model, [])
    found = [own]
    for name, info in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        members, container = submodels(info.annotation)
        row = Row(name, type_name(info.annotation, info), default_text(info), describe(model, name, info))
        own.rows.append(row)
        if not members:
            continue
        sub = f"{key}[]" if container == "list" else f"{key}.*" if container == "dict" else key
        variants = [discriminator(member, info) if len(members) > 1 else "" for member in members]
        links = ", ".join(f"[{heading(sub, v)}](#{anchor(heading(sub, v))})" for v in variants)
        row.see = f"See {links}."
        for member, variant in zip(members, variants):
            found += sections(member, sub, variant)
    return found


def heading(path: str, variant: str) -> str:
    """A section's title: its path, and for one member of a union which one it is."""
    title = path or "top level"
    return f"{title} ({variant})" if variant else title


def submodels(annotation: Any) -> tuple[list[type[BaseModel]], str]:
    """The pydantic models a field's type holds, and how (`''` directly, `list` or `dict` of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation], ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return submodels(args[0])
    if origin in (typing.Union, types.UnionType):
        found = [(m, c) for a in args for m, c in [submodels(a)] if m]
        return [m for ms, _ in found for m in ms], found[0][1] if found else ""
    if origin in (list, tuple, set, frozenset) and args:
        return submodels(args[0])[0], "list"
    if origin is dict and len(args) == 2:
        return submodels(args[1])[0], "dict"
    return [], ""


def discriminator(member: type[BaseModel], info: FieldInfo) -> str:
    """`kind: vllm` for a member of a union told apart by a literal field."""
    for name in filter(None, [info.discriminator if isinstance(info.discriminator, str) else None, "kind"]):
        field = member.model_fields.get(name)
        if field is not None and typing.get_origin(field.annotation) is Literal:
            return f"{name}: {', '.join(str(v) for v in typing.get_args(field.annotation))}"
    return member.__name__


def type_name(annotation: Any, info: FieldInfo | None = None) -> str:
    """A short readable type: `int >= 1`, `"sync" | "async"`, `list[str]`, `float | null`."""
    text = _type(annotation)
    bounds = [f"{op} {getattr(m, attr)}" for m in (info.metadata if info else [])
              for attr, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if hasattr(m, attr)]
    return f"{text} {', '.join(bounds)}" if bounds else text


def _type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(_type(a) for a in args))
    if origin in (list, tuple, set, frozenset):
        items = [a for a in args if a is not Ellipsis]
        return f"list[{' | '.join(dict.fromkeys(_type(a) for a in items))}]" if items else "list"
    if origin is dict:
        return f"dict[{_type(args[0])}, {_type(args[1])}]" if args else "dict"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        return "path" if issubclass(annotation, Path) else "section" if issubclass(annotation, BaseModel) \
            else annotation.__name__
    return str(annotation).replace("typing.", "")


def default_text(info: FieldInfo) -> str:
    """The default as YAML would write it; `required` for a field without one."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(_plain(value))


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def describe(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    """The field's docstring on one line ('' when it has none)."""
    text = info.description or ""
    return " ".join(text.split())


def anchor(path: str) -> str:
    """The Markdown heading anchor of a section path (GitHub's: lower case, punctuation dropped)."""
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(root: type[BaseModel] | None = None) -> str:
    """The whole reference as Markdown."""
    if root is None:
        from orchestration.config.schema import RunConfig

        root = RunConfig
    out, seen = [HEADER], set()
    for section in sections(root) + service_only(root):
        if (section.path, section.variant, section.model) in seen:  # e.g. a sub-section both engines share
            continue
        seen.add((section.path, section.variant, section.model))
        out.append(f"## {heading(section.path, section.variant)}\n")
        if section.path and (doc := inspect.getdoc(section.model)) and doc != inspect.getdoc(BaseModel):
            out.append(" ".join(doc.split("\n\n")[0].split()) + "\n")
        out.append("| key | type | default | description |\n|---|---|---|---|")
        out += [f"| `{r.key}` | {cell(r.type)} | `{cell(r.default)}` | {cell(' '.join(filter(None, [r.doc, r.see])))} |"
                for r in section.rows]
        out.append("")
    return "\n".join(out)


def service_only(root: type[BaseModel]) -> list[Section]:
    """The sections `aha tinker`'s ServiceConfig has and the run's config has not (the API's limits)."""
    from orchestration.config.schema import RunConfig, ServiceConfig

    if root is not RunConfig:
        return []
    return [section for name in ServiceConfig.model_fields.keys() - RunConfig.model_fields.keys()
            if name != "judge_engine"
            for section in sections(ServiceConfig.model_fields[name].annotation, f"{name} (aha tinker)")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestration.config.reference", description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"write {DOC.relative_to(DOC.parents[1])} instead of printing")
    args = p.parse_args(argv)
    text = render()
    if args.write:
        DOC.write_text(text)
        print(f"wrote {DOC}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
