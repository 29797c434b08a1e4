"""Per-module seconds of a suite run, from the `--durations=0` report of `bash scripts/test.sh --durations=0`.

Sums setup, call and teardown of every test per module (the unit tests as one row) and prints a Markdown table,
slowest first, one column per log given, with the lane each module runs in (tests/conftest.py `LANES`) and each
log's lane summary lines. How the table in docs/benchmarks.md ("The test suite's time") was made:

    CI=true bash scripts/test.sh --durations=0 > suite.log 2>&1
    .venv/bin/python bench/suite_modules.py OLD.log suite.log

Seconds in lanes are each test's own wall time while the other lanes share the cores: they add up to more than the
suite's wall time, and a module's figure grows with what ran beside it. What a module costs the cores, whatever ran
beside it, is its CPU time with every process it started (tests/cpu_accounting.py):

    AHA_CPU_ACCOUNTING=/tmp/cpu CI=true bash scripts/test.sh --durations=0 > suite.log 2>&1
    .venv/bin/python bench/suite_modules.py --cpu /tmp/cpu
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

DURATION = re.compile(r"^([0-9.]+)s (?:setup|call|teardown)\s+(tests/\S+?)::")
TESTS = Path(__file__).resolve().parents[1] / "tests"
LANE_LINE = re.compile(r"^(live|live2|compile) lane: .*")


def module_seconds(log: Path) -> dict[str, float]:
    """{module: seconds} from one log's durations report."""
    seconds: dict[str, float] = collections.Counter()
    for line in log.read_text(errors="replace").splitlines():
        if m := DURATION.match(line):
            module = "tests/unit/ (all)" if m.group(2).startswith("tests/unit/") else m.group(2).rsplit("/", 1)[-1]
            seconds[module] += float(m.group(1))
    return dict(seconds)


def lane(module: str) -> str:
    """The lane tests/conftest.py puts the module in (conftest imported once, on the first call)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from conftest import lane_of

    return lane_of("tests/unit/x" if module.startswith("tests/unit") else f"tests/integration/{module}")


def cpu_table(folder: Path) -> None:
    """The per-module CPU seconds tests/cpu_accounting.py wrote (one file per lane), most first, and each lane's sum."""
    rows = []
    for tsv in sorted(folder.glob("*.tsv")):
        for line in tsv.read_text().splitlines():
            module, cpu, wall = line.split("\t")
            rows.append((tsv.stem, module.rsplit("/", 1)[-1] if "(all)" not in module else module, float(cpu),
                         float(wall)))
    if not rows:
        sys.exit(f"no <lane>.tsv in {folder}: run the suite with AHA_CPU_ACCOUNTING={folder}")
    print("| module | lane | CPU (core-s) | wall in its lane (s) |")
    print("|---|---|---|---|")
    for lane_name, module, cpu, wall in sorted(rows, key=lambda r: -r[2]):
        print(f"| `{module}` | {lane_name} | {cpu:.0f} | {wall:.0f} |")
    for lane_name in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == lane_name]
        print(f"| {lane_name} lane | | {sum(r[2] for r in mine):.0f} | {sum(r[3] for r in mine):.0f} |")
    print(f"| all | | {sum(r[2] for r in rows):.0f} | |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logs", nargs="*", type=Path, help="suite logs, oldest first")
    p.add_argument("--cpu", type=Path, help="the AHA_CPU_ACCOUNTING folder of a run: its CPU seconds per module")
    args = p.parse_args()
    if args.cpu:
        cpu_table(args.cpu)
        return
    tables = [module_seconds(log) for log in args.logs]
    if not any(tables):
        sys.exit("no `--durations=0` report in these logs: run the suite with `bash scripts/test.sh --durations=0`")
    modules = sorted(set().union(*tables), key=lambda m: -tables[-1].get(m, 0.0))
    print("| module | lane | " + " | ".join(f"{log.name} (s)" for log in args.logs) + " |")
    print("|---|---|" + "---|" * len(args.logs))
    for module in modules:
        cells = " | ".join(f"{t[module]:.0f}" if module in t else "-" for t in tables)
        print(f"| `{module}` | {lane(module)} | {cells} |")
    print("| total | | " + " | ".join(f"{sum(t.values()):.0f}" for t in tables) + " |")
    for log in args.logs:
        for line in log.read_text(errors="replace").splitlines():
            if LANE_LINE.match(line):
                print(f"{log.name}: {line}")


if __name__ == "__main__":
    main()
