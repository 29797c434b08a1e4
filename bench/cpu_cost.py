"""What one command costs this machine in CPU: wall seconds, busy core-seconds (all of /proc/stat, so the Ray daemons
and engine processes a run starts count too, whoever their parent), and the processes that used the most.

Run it on an idle box (anything else running is counted too):

    .venv/bin/python bench/cpu_cost.py -- .venv/bin/python -m orchestration.cli.train --config configs/countdown_smollm2_cpu.yaml \
        --run-dir /tmp/cost model.path=tiny-llama train.steps=2 ...

Per-process figures come from /proc/PID/stat, sampled twice a second: a process that lives less than that is missed,
and one's last half second may be. The busy total is exact.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

from cpu_busy import cpu_times

HZ = os.sysconf("SC_CLK_TCK")


def process_seconds(seen: dict[int, tuple[float, str]]) -> None:
    """Update {pid: (cpu seconds, name)} with every process now alive."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # exited since the listing
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        seconds = (int(rest[11]) + int(rest[12])) / HZ  # utime + stime
        name = comm if comm.startswith(("ray::", "VLLM::")) or not cmd else cmd
        seen[int(pid)] = (seconds, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--top", type=int, default=12, help="processes to list")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command after --")
    before: dict[int, tuple[float, str]] = {}
    process_seconds(before)
    total0, idle0 = cpu_times()
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[int, tuple[float, str]] = {}
    while proc.poll() is None:
        process_seconds(seen)
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    total1, idle1 = cpu_times()
    busy = ((total1 - total0) - (idle1 - idle0)) / HZ
    print(f"exit {proc.returncode}; wall {wall:.1f} s; busy {busy:.1f} core-seconds (the whole machine)")
    grown = {pid: (s - before.get(pid, (0.0, ""))[0], name) for pid, (s, name) in seen.items()}
    for pid, (seconds, name) in sorted(grown.items(), key=lambda kv: -kv[1][0])[:args.top]:
        if seconds >= 0.1:
            print(f"{seconds:7.1f} s  {name[:110]}")


if __name__ == "__main__":
    main()
