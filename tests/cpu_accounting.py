"""CPU seconds per test module, with every process a module starts counted (engines, Ray daemons, training runs).

A pytest plugin, on when AHA_CPU_ACCOUNTING names a folder: the pytest process moves itself into a cgroup of its own
(cgroup v1 `cpuacct`), which every process it starts inherits, Ray's daemons and engine servers included, and reads
the cgroup's CPU total at each module's first test and at the end. Wall time per module (`--durations=0`) says how
long a module took in a lane that shares the cores with the others; this says how much of the cores it used, which is
what the lanes share. Each pytest process writes `<folder>/<lane>.tsv` (module, CPU seconds, wall seconds);
`bench/suite_modules.py --cpu <folder>` prints them as one table.

Needs root and a cgroup v1 cpuacct hierarchy (this box and CI); anywhere else it says so once and counts nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuAccounting:
    """Module -> (CPU s, wall s) of this pytest process's cgroup."""

    def __init__(self, out: Path, lane: str):
        self.out, self.lane = out, lane
        self.group = CPUACCT / f"aha-tests-{lane}-{os.getpid()}"
        self.group.mkdir()
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        self.rows: dict[str, list[float]] = {}
        self.module: str | None = None
        self.mark = (0.0, 0.0)  # (CPU s, monotonic s) at the current module's start; set with the first module

    def _now(self) -> tuple[float, float]:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9, time.monotonic()

    def _close(self) -> None:
        if self.module is not None:
            (cpu, wall), (cpu0, wall0) = self._now(), self.mark
            row = self.rows.setdefault(self.module, [0.0, 0.0])
            row[0] += cpu - cpu0
            row[1] += wall - wall0

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item):
        module = item.nodeid.split("::")[0]
        if module.startswith("tests/unit/"):
            module = "tests/unit/ (all)"
        if module != self.module:
            self._close()
            self.module, self.mark = module, self._now()

    def pytest_sessionfinish(self):
        self._close()
        self.module = None
        self.out.mkdir(parents=True, exist_ok=True)
        lines = [f"{m}\t{cpu:.1f}\t{wall:.1f}" for m, (cpu, wall) in self.rows.items()]
        (self.out / f"{self.lane}.tsv").write_text("\n".join(lines) + "\n")
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))  # back to the root group, so that ours can go
        with contextlib.suppress(OSError):  # still holds a process a test left running: it stays, harmless
            self.group.rmdir()


def register(config) -> None:
    """Count CPU per module in this pytest process if AHA_CPU_ACCOUNTING is set (tests/conftest.py calls it)."""
    out = os.environ.get("AHA_CPU_ACCOUNTING")
    if not out:
        return
    try:
        plugin = CpuAccounting(Path(out), os.environ.get("AHA_TEST_LANE") or "all")
    except OSError as err:
        print(f"AHA_CPU_ACCOUNTING: no cgroup of its own under {CPUACCT} ({err}); nothing counted")
        return
    config.pluginmanager.register(plugin, "aha-cpu-accounting")
