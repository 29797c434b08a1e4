"""Every shipped config validates; config mistakes come back as one readable line each, with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.config.schema import RunConfig, ServiceConfig
from orchestration.config.errors import ConfigError, leaf_paths
from orchestration.config.files import dump_config, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
DEMO = ROOT / "configs" / "countdown_smollm2_cpu.yaml"


def test_shipped_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"countdown_smollm2_cpu.yaml", "math_smollm2_cpu.yaml"} <= names, f"missing demo configs: {names}"
    assert any("tpu" in n for n in names), "no TPU config shipped"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_validates_and_resumes_as_itself(path, tmp_path):
    """`--resume` reloads the run's saved config.yaml: it must validate again and equal the config that started the
    run (a field that does not survive YAML, or a validator that rewrites a value, would change a resumed run)."""
    schema = ServiceConfig if path.name.startswith("tinker_") else RunConfig  # `aha tinker`'s configs
    cfg = load_config(path, schema=schema)
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml", schema=schema) == cfg


def test_overrides_are_typed_and_reach_the_sampling_params():
    cfg = load_config(DEMO, ["rollout.sampling.top_k=7", "rollout.sampling.stop=['</answer>', 'END']",
                             "train.steps=3"])
    assert cfg.rollout.sampling.top_k == 7
    assert list(cfg.rollout.sampling.stop) == ["</answer>", "END"]
    assert cfg.train.steps == 3


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, ["train.stpes=3"])
    assert str(err.value) == "train.stpes: unknown key; did you mean train.steps?"


def test_unknown_nested_key_suggests_the_right_one():
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, ["rollout.sampling.temprature=0.5"])
    assert "rollout.sampling.temprature: unknown key; did you mean rollout.sampling.temperature?" == str(err.value)


@pytest.mark.parametrize(("override", "message"), [
    # a key in the wrong section: the right leaf is found anywhere in the tree
    ("learner.lrr=1e-5", "learner.lrr: unknown key; did you mean learner.optimizer.lr?"),
    # a misspelt section: the leaves written under it are matched
    ("rolout.sampling.n=4", "rolout: unknown key; did you mean rollout.sampling.n?"),
    ("learner.optimzer.lr=1e-5", "learner.optimzer: unknown key; did you mean learner.optimizer.lr?"),
    # a name cut short, inside the engine union
    ("rollout.backend.gpu_mem=0.3",
     "rollout.backend.gpu_mem: unknown key; did you mean rollout.backend.gpu_memory_utilization?"),
    # inside a list of sections
    ("rewards.terms=[{name: countdown, wieght: 1}]",
     "rewards.terms.0.wieght: unknown key; did you mean rewards.terms.weight?"),
    # nothing close: no guess
    ("zzz=1", "zzz: unknown key"),
])
def test_unknown_key_is_matched_against_every_leaf_of_the_tree(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, [override])
    assert str(err.value) == message


def test_leaf_paths_cover_every_section_and_both_engines():
    leaves = leaf_paths(RunConfig)
    assert {"learner.optimizer.lr", "rollout.sampling.temperature", "train.steps", "rewards.terms.weight",
            "rollout.backend.gpu_memory_utilization", "rollout.backend.page_size"} <= set(leaves)
    assert not any(p.endswith((".optimizer", ".sampling", ".backend")) for p in leaves)  # sections are no leaves


def test_bad_value_names_field_value_and_rule():
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, ["train.steps=-1"])
    line = str(err.value)
    assert line.startswith("train.steps: ") and "(got -1)" in line and "\n" not in line


def test_group_of_one_is_rejected_with_the_reason():
    with pytest.raises(ConfigError, match=r"rollout.sampling.n \(1\) must be >= 2"):
        load_config(DEMO, ["rollout.sampling.n=1"])


def test_override_without_equals_is_explained():
    with pytest.raises(ConfigError, match="is not key=value"):
        load_config(DEMO, ["train.steps"])


def test_cli_config_error_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEMO.read_text() + "\nbogus_section: {a: 1}\n")
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli.train", "--config", str(bad), "--run-dir", str(tmp_path / "run"),
                           "train.steps=0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "bogus_section: unknown key" in proc.stderr
    assert "train.steps: Input should be greater than or equal to 1 (got 0)" in proc.stderr
    assert not (tmp_path / "run").exists(), "a config error must not create a run directory"
    assert proc.stderr.startswith("config error: 2 problems:\n"), proc.stderr


def test_cli_one_config_mistake_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "orchestration.cli.train", "--config", str(DEMO), "--run-dir",
                           str(tmp_path / "run"), "learner.lrr=1e-5"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("config error: learner.lrr"), proc.stderr
    assert "learner.optimizer.lr" in proc.stderr, proc.stderr


@pytest.mark.parametrize("tool", ["preflight", "eval", "serve"])
def test_every_cli_reports_config_mistakes_like_train(tool, tmp_path):
    """Two mistakes: a count line, then one line per problem, whichever command read the config."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(DEMO.read_text() + "\nbogus_section: {a: 1}\nbogus_key: 2\n")
    args = {"preflight": ["--config", str(run_dir / "config.yaml")], "eval": [str(run_dir / "config.yaml")],
            "serve": [str(run_dir)]}[tool]
    proc = subprocess.run([sys.executable, "-m", f"orchestration.cli.{tool}", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == f"{tool}: 2 problems:" and len(lines) == 3, proc.stderr
    assert sorted(line.split(":")[0] for line in lines[1:]) == ["bogus_key", "bogus_section"], proc.stderr


def test_engine_is_one_key_and_its_limits_are_checked_at_load():
    cfg = load_config(DEMO, ["rollout.backend.kind=sglang_jax"])
    assert cfg.rollout.backend.kind == "sglang_jax"
    assert cfg.rollout.sampling == load_config(DEMO).rollout.sampling, "switching engines changed the sampling"
    with pytest.raises(ConfigError, match=r"rollout.sampling.top_p \(0.9\): sglang_jax .* takes its logprobs before top_p"):
        load_config(DEMO, ["rollout.backend.kind=sglang_jax", "rollout.sampling.top_p=0.9"])


def test_lora_rank_must_fit_the_engine():
    with pytest.raises(ConfigError, match=r"learner.lora.rank \(32\) exceeds rollout.backend.max_lora_rank \(16\)"):
        load_config(DEMO, ["learner.lora.rank=32"])


def test_engine_corrections_are_checked_at_load():
    """learner.grpo.correction: a correction that truncates or masks at is_cap refuses a null cap, icepop an empty
    band, each in one line; and with any correction but tis, `is_cap: null` does not turn the correction off, so
    an engine whose logprobs the learner cannot reproduce (sglang_jax before top_p) is still refused. Fails before
    the corrections existed (unknown key)."""
    with pytest.raises(ConfigError, match=r"^learner.grpo: correction seq_tis truncates or masks at is_cap, which is "
                                          r"null; set learner.grpo.is_cap"):
        load_config(DEMO, ["learner.grpo.correction=seq_tis", "learner.grpo.is_cap=null"])
    with pytest.raises(ConfigError, match=r"icepop_low \(5.0\) must be below icepop_high \(5.0\)"):
        load_config(DEMO, ["learner.grpo.correction=icepop", "learner.grpo.icepop_low=5"])
    sglang_top_p = ["rollout.backend.kind=sglang_jax", "rollout.sampling.top_p=0.9", "learner.grpo.is_cap=null"]
    assert load_config(DEMO, sglang_top_p).learner.grpo.corrects_engine is False
    with pytest.raises(ConfigError, match=r"takes its logprobs before top_p .*off \(learner.grpo.correction: tis"):
        load_config(DEMO, [*sglang_top_p, "learner.grpo.correction=icepop"])
