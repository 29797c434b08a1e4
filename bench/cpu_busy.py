"""How busy this machine's cores are: the share of non-idle CPU time in /proc/stat, sampled every few seconds.

Run it beside something else (a test suite, a training run) to see how much of the box that job leaves idle:

    .venv/bin/python bench/cpu_busy.py --samples 24 --every 5      # 2 minutes: each sample, then the mean
"""

from __future__ import annotations

import argparse
import time


def cpu_times() -> tuple[int, int]:
    """(total, idle) jiffies over all cores since boot; idle includes iowait."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--every", type=float, default=5.0, help="seconds per sample")
    args = p.parse_args()
    busy = []
    total, idle = cpu_times()
    for _ in range(args.samples):
        time.sleep(args.every)
        now_total, now_idle = cpu_times()
        busy.append(1 - (now_idle - idle) / max(now_total - total, 1))
        total, idle = now_total, now_idle
    print(" ".join(f"{b:.2f}" for b in busy))
    print(f"mean busy fraction of all cores: {sum(busy) / len(busy):.2f}")


if __name__ == "__main__":
    main()
