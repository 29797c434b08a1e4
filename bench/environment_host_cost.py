"""What running each episode in a process of its own costs (tasks/environments/host.py), against the same episodes
played in the driver's threads: the wall time of a step's episodes' environment calls and the memory the processes
take. No engine: every episode's turns are a fixed text, so only the environment side is timed.

    .venv/bin/python bench/environment_host_cost.py                 # the guessing game, 32 episodes x 4 turns, 5 rounds

The first round includes the host's start (it imports and builds the environment); memory is the proportional set
size (PSS: shared pages split between the processes sharing them) of the host and of the episodes' processes,
read while every episode is open.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


async def play(environment, rows, episodes: int, turns: int, measure=None) -> None:
    from tasks.environments.base import ModelTurn, call

    async def one(row):
        episode = environment.episode(row)
        await call(episode.opening)
        for turn in range(turns):
            await call(episode.step, ModelTurn("no number here", turn))
        return episode

    opened = await asyncio.gather(*(one(rows[i % len(rows)]) for i in range(episodes)))
    if measure is not None:
        measure(opened)
    for episode in opened:
        if hasattr(episode, "close"):
            await call(episode.close)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=32, help="episodes at once (guess_smollm2_cpu.yaml: 4 x 8)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    from tasks.config import DataConfig
    from tasks.environments.catalog import setup_environment
    from tasks.environments.config import EnvironmentConfig

    hosted = setup_environment(EnvironmentConfig(name="guessing"))
    rows = hosted.rows(DataConfig(train_size=8, eval_size=1), "train")
    memory = {}

    def measure(opened) -> None:
        children = [pss_kib(e.pid) for e in opened]
        memory.update(host=pss_kib(hosted.host.proc.pid), child=statistics.mean(children), total=sum(children))

    for name, environment in (("in threads", hosted.environment), ("hosted", hosted)):
        times = []
        for i in range(args.rounds):
            start = time.perf_counter()
            asyncio.run(play(environment, rows, args.episodes, args.turns,
                             measure if name == "hosted" and i == args.rounds - 1 else None))
            times.append(time.perf_counter() - start)
        rest = times[1:] or times
        print(f"{name:>10}: {args.episodes} episodes x {args.turns} turns: first round {times[0] * 1e3:.0f} ms, then "
              f"median {statistics.median(rest) * 1e3:.0f} ms ({statistics.median(rest) / args.episodes * 1e3:.2f} "
              "ms an episode)")
    print(f"memory (PSS) with {args.episodes} episodes open: host {memory['host'] / 1024:.1f} MiB, each episode's "
          f"process {memory['child'] / 1024:.1f} MiB, all of them {memory['total'] / 1024:.1f} MiB")
    hosted.close()


if __name__ == "__main__":
    main()
