"""Every repository path the user docs name exists: README.md, docs/*.md and learner/README.md.

Paths are found as written (`rollout/fleet.py`, `configs/x.yaml`, a bare `test_x.py`, `python -m orchestration.cli.eval`,
a Markdown link target); placeholders (`requirements/NAME.lock`, `configs/*.yaml`) are not paths. The learner's
README must also list every module of learner/ in its table.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "learner" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = r"(?:rollout|learner|rewards|orchestration|tasks|tests|bench|configs|scripts|docs|requirements|\.ci)"
PATH = re.compile(rf"(?<![\w/.$~-]){TOP}/[\w./{{}}*-]*[\w*}}/]")
MODULE = re.compile(r"python -m ((?:rollout|learner|rewards|orchestration|tasks|bench)(?:\.\w+)+)")
TEST_FILE = re.compile(r"(?<![\w/])(test_\w+\.py)\b")
LINK = re.compile(r"\]\(([^)#\s]+)\)")
PLACEHOLDER = re.compile(r"[A-Z]{2,}|[*{}]|/[A-Z][./]")  # NAME, YOUR_SLICE, *, {name}, configs/X.yaml
# Pages other branches add (the README links them already); a missing one is excused until they are merged.
PENDING = {"docs/demo.md", "docs/your_own_task.md", "docs/environments.md"}


def named_paths(text: str, folder: Path) -> set[str]:
    """The repository paths `text` names (a page in `folder`: its links are relative to it)."""
    # A path has a file extension or ends in "/" (`learner/grad_norm` without either is a metric key).
    paths = {p.rstrip(".") for p in PATH.findall(text + " ") if not PLACEHOLDER.search(p)}
    paths = {p for p in paths if p.endswith("/") or "." in p.rsplit("/", 1)[-1]}
    paths |= {m.replace(".", "/") + ".py" for m in MODULE.findall(text)}
    for target in LINK.findall(text):
        if "://" not in target:
            paths.add(str((folder / target).resolve().relative_to(ROOT)))
    return paths


def test_every_path_the_docs_name_exists():
    tests = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    stale = []
    for doc in DOCS:
        where = doc.relative_to(ROOT)
        stale += [f"{where}: {p}" for p in sorted(named_paths(doc.read_text(), doc.parent))
                  if not (ROOT / p).exists() and p not in PENDING]
        stale += [f"{where}: {t}" for t in sorted(set(TEST_FILE.findall(doc.read_text()))) if t not in tests]
    assert not stale, "the docs name paths that do not exist:\n" + "\n".join(stale)


def test_the_path_finder_finds_paths_and_skips_the_rest():
    text = ("Run `bash scripts/demo.sh` or python -m orchestration.cli.eval, see rollout/fleet.py. and\n"
            "[the config](config.md); not requirements/NAME.lock, configs/*.yaml, configs/X.yaml, learner/grad_norm "
            "or runs/demo/x.py.")
    found = named_paths(text, ROOT / "docs")
    assert found == {"scripts/demo.sh", "orchestration/cli/eval.py", "rollout/fleet.py", "docs/config.md"}, found
    readme = named_paths((ROOT / "README.md").read_text(), ROOT)
    assert {"scripts/demo.sh", "configs/countdown_smollm2_cpu.yaml", "docs/config.md"} <= readme, readme


def test_the_learner_readme_lists_every_learner_module():
    text = (ROOT / "learner" / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", text, re.M))
    modules = {p.name for p in (ROOT / "learner").glob("*.py")} - {"__init__.py"}
    assert modules <= listed, f"learner/README.md's module table lacks {sorted(modules - listed)}"
    assert listed <= modules, f"learner/README.md lists modules that do not exist: {sorted(listed - modules)}"
