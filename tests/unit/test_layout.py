"""The house's shape, read from the code's imports (every import, deferred and TYPE_CHECKING ones included):

- common/ is the ground floor: the standard library, pydantic, numpy and itself, so every env can import it;
- the parts (rollout, learner, rewards, tasks) import common/ and themselves, never each other sideways, and never
  orchestration (the loop wires them);
- no two modules import each other, directly or round a longer circle (a deferred import hides a circle, it does
  not remove it);
- the loop drives the parts through their handles: orchestration/loop.py imports no Ray;
- orchestration/ keeps the loop and its run at its top level, the rest in cli/, config/ and cluster/.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "rollout", "learner", "rewards", "tasks", "orchestration")
PARTS = ("rollout", "learner", "rewards", "tasks")
GROUND_FLOOR_THIRD_PARTY = {"pydantic", "numpy", "safetensors", "fsspec", "gcsfs"}
# safetensors, fsspec and gcsfs are imported inside functions only (the adapter files, gs:// paths), where the env
# that calls them has them; at import time common/ needs the standard library, pydantic and numpy alone.
TOP_LEVEL_LIMIT = 16


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = path
    return out


MODULES = modules()


def imported(path: Path, name: str) -> set[str]:
    """Every module name `path` imports (absolute names; relative imports resolved)."""
    names = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def project_imports(path: Path, name: str) -> set[str]:
    """The project modules `path` imports (a name `from pkg import thing` resolves to pkg.thing if a module)."""
    out = set()
    for target in imported(path, name):
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


GRAPH = {name: project_imports(path, name) for name, path in MODULES.items()}


def test_the_ground_floor_imports_only_the_standard_library_pydantic_and_numpy() -> None:
    bad = []
    for name, path in MODULES.items():
        if name.split(".")[0] != "common":
            continue
        for target in imported(path, name):
            top = target.split(".")[0]
            if top and top not in sys.stdlib_module_names and top != "common" and top not in GROUND_FLOOR_THIRD_PARTY:
                bad.append(f"{name} imports {target}")
    assert not bad, "common/ must run in every env (learner, driver, engines): " + "; ".join(bad)


def test_no_part_imports_another_part_or_orchestration() -> None:
    bad = [f"{name} -> {target}" for name, targets in GRAPH.items() if name.split(".")[0] in PARTS
           for target in targets if target.split(".")[0] not in ("common", name.split(".")[0])]
    assert not bad, ("a part imports another sideways (put the shared contract in common/) or orchestration (the "
                     "loop wires the parts): " + "; ".join(sorted(bad)))


def test_no_import_circles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(GRAPH)))
    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not circles, f"modules that import each other (move the shared piece into a module of its own): {circles}"


def test_the_loop_imports_no_ray() -> None:
    names = imported(MODULES["orchestration.loop"], "orchestration.loop")
    assert not any(n == "ray" or n.startswith("ray.") for n in names), \
        "orchestration/loop.py calls the learner and the engines through their handles, never Ray"


def test_orchestration_keeps_about_a_dozen_modules_at_its_top() -> None:
    top = sorted(p.stem for p in (ROOT / "orchestration").glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_LEVEL_LIMIT, f"orchestration/ has {len(top)} top-level modules: {top}"


def test_the_checks_above_see_what_they_check() -> None:
    """Vacuity: the graph holds the modules and edges the rules talk about."""
    assert {"common.strict", "learner.handle", "rollout.protocol", "orchestration.loop"} <= set(MODULES)
    assert "learner.handle" in GRAPH["orchestration.state"] and "common.strict" in GRAPH["learner.config"]
    assert any(t.startswith("ray") for t in imported(MODULES["learner.handle"], "learner.handle"))
