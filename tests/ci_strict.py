"""Under CI, a test that does not run is a failure: a skip, an xfail or an xpass fails with one line naming the test
and why; so does a run that collects no test.

A skip hides what it skips: a missing engine env, a missing privilege, a model not prepared. On a developer's box
that is a hint; on CI it is a suite that went green with part of the product untested. So when the environment
variable CI is set (true, 1, yes: what CI services and `.ci/run` set), this plugin (registered by tests/conftest.py)
turns each such report into a failure whose message is the one line, and the session's exit status into 1 when
nothing was collected (pytest's own 5, which scripts/test.sh also refuses under CI).
"""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _why(report) -> str:
    """The reason pytest recorded for a skip ((file, line, "Skipped: why") or a plain string) or an xfail."""
    if getattr(report, "wasxfail", None) is not None:
        return f"marked xfail ({report.wasxfail or 'no reason given'})"
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail(report, what: str) -> None:
    report.outcome = "failed"
    report.longrepr = f"CI runs every test: {report.nodeid} {what}; make it run here (CI is set)"
    if hasattr(report, "wasxfail"):
        del report.wasxfail


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: after pytest's own skip/xfail handling
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not under_ci():
        return
    if report.skipped:
        _fail(report, f"was skipped: {_why(report)}" if not hasattr(report, "wasxfail") else _why(report))
    elif report.passed and hasattr(report, "wasxfail"):  # an xpass: the marker is stale or the test is wrong
        _fail(report, f"passed but is {_why(report)}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    report = (yield).get_result()
    if under_ci() and report.skipped:  # a module-level skip or importorskip
        _fail(report, f"was skipped at collection: {_why(report)}")


def pytest_sessionfinish(session, exitstatus):
    if under_ci() and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        lane = os.environ.get("AHA_TEST_LANE")
        session.config.get_terminal_writer().line(
            f"CI runs every test: {'the ' + lane + ' lane' if lane else 'this run'} collected none (an empty lane or "
            "selection fails under CI)", red=True)
