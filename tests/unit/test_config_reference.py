"""docs/config.md is the config reference generated from the models, current, complete, and reachable from the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestration.config.schema import RunConfig
from orchestration.config.errors import leaf_paths
from orchestration.config.reference import DOC, REGENERATE, render, sections

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_current():
    assert DOC == ROOT / "docs" / "config.md"
    assert DOC.read_text() == render(), f"docs/config.md differs from the config models; regenerate it: {REGENERATE}"


def test_every_key_of_the_tree_has_a_row_with_its_docstring():
    rows = {}
    for section in sections(RunConfig):
        path = section.path.replace("[]", "").replace(".*", "")
        rows.update({f"{path}.{r.key}" if path else r.key: r for r in section.rows})
    missing = [leaf for leaf in leaf_paths(RunConfig) if leaf not in rows]
    assert not missing, f"keys the reference does not show: {missing}"
    undocumented = sorted(path for path, row in rows.items() if not row.doc)
    assert not undocumented, f"config fields without a docstring (write one under each field): {undocumented}"
    assert rows["learner.optimizer.lr"].type == "float > 0" and rows["learner.optimizer.lr"].default == "2e-05"
    assert rows["rollout.backend.gpu_memory_utilization"].doc, "the vLLM member of the engine union is not walked"
    assert rows["rollout.backend.page_size"].doc, "the SGLang-JAX member of the engine union is not walked"


def test_aha_train_help_config_prints_the_reference():
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli", "train", "--help-config"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == render()
    helped = subprocess.run([sys.executable, "-m", "orchestration.cli.train", "--help"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert helped.returncode == 0 and "--help-config" in helped.stdout, helped.stdout
