"""The guessing game written for verifiers 0.4, with verifiers' own classes only: a stand-in for a user's environment.

Nothing here knows about aha. It is laid out as verifiers' TextArena taskset is: a `Taskset` of `Task`s, an `Env`
whose `run()` plays the game host-side as the conversation's user (`interaction.turn(feedback)`), and a `@vf.reward`
on the task that reads the trace. Verifiers loads a taskset by its top-level module name (`taskset: {id: vf_guess}`),
as an installed environment package is named; aha runs it through tasks/environments/verifiers_adapter.py with this
folder on the import path (configs/guess_verifiers_smollm2_cpu.yaml).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

SYSTEM_PROMPT = "You are playing a guessing game. Reply with one number only: your guess."


class GuessConfig(vf.TasksetConfig):
    high: int = 16
    """Secrets are drawn from 1..high."""
    seed: int = 0


class GuessData(vf.TaskData):
    secret: int
    high: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, trace: vf.Trace) -> float:
        return 1.0 if trace.info.get("found") else 0.0

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    INFINITE = True

    def load(self) -> Iterator[GuessTask]:
        rng = random.Random(self.config.seed)
        index = 0
        while True:
            secret = rng.randint(1, self.config.high)
            prompt = f"I am thinking of an integer from 1 to {self.config.high}. Guess it."
            yield GuessTask(GuessData(name=f"guess#{index}", prompt=prompt, system_prompt=SYSTEM_PROMPT,
                                      secret=secret, high=self.config.high), self.config.task)
            index += 1


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret = task.data.secret
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                match = re.search(r"-?\d+", segment.last_reply)
                if match is None:
                    feedback = f"Reply with one number from 1 to {task.data.high}."
                elif int(match.group()) == secret:
                    interaction.trace.info["found"] = True
                    break
                else:
                    feedback = "Higher." if int(match.group()) < secret else "Lower."
                segment = await interaction.turn(feedback)


__all__ = ["GuessEnv", "GuessTaskset"]
