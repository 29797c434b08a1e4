"""Under CI nothing may skip, and a red suite says why at once: tests/ci_strict.py and scripts/lanes.sh, run on a
throwaway test folder (real pytest processes, the real script).

Fails on main at 85b20f9: nothing read CI (skips and xfails passed, an empty lane was accepted), and a lane's
failures were printed only after every lane had ended.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPING = '''
import pytest

def test_ok():
    pass

def test_skip():
    pytest.skip("engine env missing")

@pytest.mark.skip(reason="not today")
def test_marked():
    pass

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False

@pytest.mark.xfail(reason="stale marker")
def test_xpass():
    pass

@pytest.fixture
def root():
    pytest.skip("needs root")

def test_fixture_skip(root):
    pass
'''


def throwaway(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: nothing of this repository's config
    (folder / "conftest.py").write_text('pytest_plugins = ["ci_strict"]\n' + files.pop("conftest.py", ""))
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def env(ci: bool) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("CI", "AHA_TEST_LANE", "AHA_CPU_ACCOUNTING", "AHA_TESTS",
                                                            "AHA_LANE_LOGS")}
    out["PYTHONPATH"] = str(ROOT / "tests")
    # No installed plugin (hypothesis, jaxtyping, anyio...) loads: what is under test is ci_strict (named by the
    # folder's conftest) and lanes.sh, and importing those plugins was 1.1 of each nested pytest's 1.3 CPU seconds.
    out["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return out | ({"CI": "true"} if ci else {})


def pytest(folder: Path, ci: bool, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder), *args],
                          cwd=folder, env=env(ci), capture_output=True, text=True, timeout=120)


def test_under_ci_each_skip_xfail_and_xpass_fails_with_one_line_naming_it(tmp_path) -> None:
    folder = throwaway(tmp_path / "t", {"test_x.py": SKIPPING})
    relaxed = pytest(folder, ci=False)
    assert relaxed.returncode == 0 and "1 passed, 3 skipped, 1 xfailed, 1 xpassed" in relaxed.stdout, relaxed.stdout
    strict = pytest(folder, ci=True)
    assert strict.returncode == 1, strict.stdout
    lines = [line for line in strict.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    expected = {"test_skip": "was skipped: engine env missing", "test_marked": "was skipped: not today",
                "test_xfail": "marked xfail (known bug)", "test_xpass": "passed but is marked xfail (stale marker)",
                "test_fixture_skip": "was skipped: needs root"}
    assert len(lines) == len(expected), lines
    for name, why in expected.items():
        (line,) = [line for line in lines if f"::{name} " in line]
        assert f"CI runs every test: test_x.py::{name} {why}; make it run here" in line, line


def test_under_ci_a_skip_at_collection_and_an_empty_run_fail(tmp_path) -> None:
    folder = throwaway(tmp_path / "t", {"test_mod.py": '''
        import pytest
        pytest.importorskip("no_such_module_here")

        def test_never():
            pass
        '''})
    assert pytest(folder, ci=False).returncode == 5  # pytest's "no tests collected"
    strict = pytest(folder, ci=True)
    assert strict.returncode != 0 and "test_mod.py was skipped at collection: could not import" in strict.stdout
    (folder / "test_mod.py").write_text("def test_one():\n    pass\n")
    assert pytest(folder, False, "-k", "nothing").returncode == 5
    strict = pytest(folder, True, "-k", "nothing")
    assert strict.returncode == 1 and "CI runs every test: this run collected none" in strict.stdout


LANE_CONFTEST = '''
import os

def pytest_collection_modifyitems(config, items):
    """Stand-in for tests/conftest.py's lanes: a test's lane is the second word of its name."""
    items[:] = [item for item in items if item.name.split("_")[1] == os.environ["AHA_TEST_LANE"]]
'''
LANES = '''
import os, time
from pathlib import Path
import pytest

def test_live_waits_for_live2_to_end():
    done = Path(os.environ["AHA_LANE_LOGS"], "live2.done")  # lanes.sh touches it after printing live2's failures
    while not done.exists():
        time.sleep(0.05)

def test_live2_fails():
    assert 1 + 1 == 3, "arithmetic"

def test_live2_skips():
    pytest.skip("engine env missing")
'''


def lanes(folder: Path, logs: Path, ci: bool) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "lanes.sh"), "-p", "no:cacheprovider"], cwd=ROOT,
                          env=env(ci) | {"AHA_TESTS": str(folder), "AHA_LANE_LOGS": str(logs)},
                          capture_output=True, text=True, timeout=300)


def test_a_lane_that_fails_says_so_the_moment_it_ends_and_the_run_ends_with_every_failure(tmp_path) -> None:
    folder = throwaway(tmp_path / "t", {"conftest.py": LANE_CONFTEST, "test_lanes.py": LANES})
    run = lanes(folder, tmp_path / "logs", ci=True)
    out = run.stdout
    assert run.returncode == 1, out[-3000:]
    early = out.index("the live2 lane failed (exit 1):")
    assert early < out.index("1 passed in"), "live2's failures came after the live lane ended, not when live2 ended"
    tail = out[out.rindex("every failure (full logs in"):].splitlines()[1:]
    assert len(tail) == 3, tail
    assert tail[0].startswith("live2: FAILED ") and tail[0].endswith("test_lanes.py::test_live2_fails - "
                                                                    "AssertionError: arithmetic"), tail
    assert tail[1].startswith("live2: FAILED ") and tail[1].endswith(
        "test_lanes.py::test_live2_skips was skipped: engine env missing; make it run here (CI is set)"), tail
    assert tail[2] == "compile: collected no test (a failure under CI)", tail
    assert re.search(r"^live lane: .*1 passed.* \(exit 0\)$", out, re.M), out[-2000:]


def test_outside_ci_an_empty_lane_and_a_skip_pass(tmp_path) -> None:
    folder = throwaway(tmp_path / "t", {"conftest.py": LANE_CONFTEST, "test_lanes.py": LANES.replace(
        'assert 1 + 1 == 3, "arithmetic"', "pass")})
    run = lanes(folder, tmp_path / "logs", ci=False)
    assert run.returncode == 0, run.stdout[-3000:]
    assert re.search(r"^live2 lane: .*1 passed, 1 skipped.* \(exit 0\)$", run.stdout, re.M), run.stdout[-2000:]
    assert re.search(r"^compile lane: .*no tests ran.* \(exit 5\)$", run.stdout, re.M), run.stdout[-2000:]
