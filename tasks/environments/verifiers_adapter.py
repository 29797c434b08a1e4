"""Run an environment written for verifiers 0.4 (`verifiers.v1`: Env, Taskset, Task) in aha, unchanged.

Config: `environment: {name: verifiers, params: {env: {taskset: {id: my_taskset}, ...}, paths: [...]}}`: `env` is
the verifiers `[env]` block as it would be given to verifiers itself, loaded with verifiers' own loaders
(`resolve_env_config`, `load_environment`), so the taskset's Env subclass, its config and its tasks are the user's.
Verifiers imports a taskset by its top-level module name (an installed environment package, or a module in the run's
working directory); `paths` adds folders to search first (examples/verifiers holds one).

In verifiers, the environment drives the conversation: `Env.run(task, agents)` opens
`agents.<seat>.interaction(task)` and calls `await interaction.turn(message)`, which sends a user message and returns
the model's reply (a `vf.Segment`); a plain taskset's `SingleAgentEnv` calls `agents.agent.run(task)`. In aha the
driver drives (tasks/environments/base.py). This adapter turns one into the other: each episode runs the verifiers
`Env.run` as a background task whose agents are aha's, and every `interaction.turn(...)` is a rendezvous: the message
becomes the `Reply` of the driver's current `step`, and the driver's next model turn becomes the `Segment` that
`turn` returns. When `run` returns, the task's `@vf.reward`s score the trace (`Task.score`) and `Env.finalize` runs;
the episode's reward is the sum of its traces' weighted rewards. A limit of aha's (turns, tokens) ends the exchange
as verifiers ends one at its own limits: `turn` returns a terminated `Segment`.

What verifiers runs elsewhere is not used: harness programs in sandboxes, the interception server, MCP tool servers
(aha's engine is the model, the driver the harness). So a task whose toolsets need MCP servers is refused with one
line; an episode plays one conversation (one seat), as aha trains one policy on one token sequence per sample.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.config import DataConfig
from tasks.dataset import Prompt, is_eval
from tasks.environments.base import Message, ModelTurn, Reply

log = logging.getLogger(__name__)

SCAN_LIMIT = 100_000
"""Most tasks read from an (infinite) taskset to fill a split."""


class VerifiersEnvironment:
    """An aha environment backed by a verifiers `Env` (see the module docstring)."""

    def __init__(self, env: dict[str, Any], paths: list[str] = ()):
        import sys

        import verifiers.v1 as vf

        for folder in reversed(list(paths)):
            if not Path(folder).is_dir():
                raise ValueError(f"environment.params.paths: {folder} is not a folder")
            if str(Path(folder).resolve()) not in sys.path:
                sys.path.insert(0, str(Path(folder).resolve()))
        try:
            self.env = vf.load_environment(vf.resolve_env_config(env))
        except Exception as exc:  # noqa: BLE001 - verifiers' own load errors, as one config line
            raise ValueError(f"environment.params.env: verifiers could not load it ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:300]})") from None
        task_cls = type(self.env.taskset).task_type()
        if task_cls.toolsets(self.env.taskset.config.task) or type(self.env.taskset).toolsets(self.env.taskset.config):
            raise ValueError(f"environment.params.env: {task_cls.__name__} has MCP toolsets, which run in verifiers' "
                             "harness programs; aha runs environments whose tools are in Env.run or the task itself")

    def rows(self, data: DataConfig, split: str) -> list[Prompt]:
        """The taskset's tasks of `split`, split by a hash of each task's key (as aha's own tasks are)."""
        size = data.train_size if split == "train" else data.eval_size
        rows: list[Prompt] = []
        for index, task in enumerate(self.env.taskset):
            if len(rows) == size or index >= SCAN_LIMIT:
                break
            if is_eval(task.key) == (split == "eval"):
                rows.append(Prompt(f"{self.env.config.env_id}-{split}-{len(rows):06d}", "verifiers", None, None,
                                   {"task": task}))
        if len(rows) < size:
            raise ValueError(f"data.{split}_size={size}, but the verifiers taskset gave {len(rows)} {split} tasks; "
                             f"lower data.{split}_size")
        return rows

    def episode(self, row: Prompt) -> VerifiersEpisode:
        return VerifiersEpisode(self.env, row.reference["task"])


_TERMINATED = object()


@dataclass
class _Request:
    """The environment asks for a model turn after `messages` (its user message, or the opening)."""

    messages: list[Message]
    answer: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class VerifiersEpisode:
    """One verifiers episode, inverted: `Env.run` runs in the background and meets the driver at each turn."""

    env: Any
    task: Any
    requests: asyncio.Queue = field(default_factory=asyncio.Queue)
    pending: _Request | None = None
    runner: asyncio.Task | None = None
    traces: list[Any] = field(default_factory=list)
    reported: bool = False

    async def opening(self) -> list[Message]:
        self.runner = asyncio.create_task(self._run())
        event = await self._next_event()
        if event is None:
            raise RuntimeError(f"{type(self.env).__name__}.run() ended before the model's first turn")
        return event.messages

    async def step(self, turn: ModelTurn) -> Reply:
        assert self.pending is not None, "step() before opening()"
        self.pending.answer.set_result(turn.text)
        event = await self._next_event()
        if event is None:
            self.reported = True
            return Reply(reward=self._reward(), done=True)
        return Reply(event.messages)

    async def close(self) -> float:
        """Ends an exchange the driver cut short (a limit) and returns its reward, as verifiers scores it."""
        if self.runner is None or self.reported:
            return 0.0
        while await self._next_event(answer=_TERMINATED) is not None:
            pass  # an environment that asks again after a terminated segment gets terminated again
        self.reported = True
        return self._reward()

    async def _next_event(self, answer: Any = None) -> _Request | None:
        """The environment's next request for a model turn, or None once `run` has finished (errors re-raised)."""
        if answer is not None and self.pending is not None and not self.pending.answer.done():
            self.pending.answer.set_result(answer)
        getter = asyncio.ensure_future(self.requests.get())
        done, _ = await asyncio.wait({getter, self.runner}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            self.pending = getter.result()
            return self.pending
        getter.cancel()
        self.runner.result()  # the environment's exception, if it raised
        return None

    async def _run(self) -> None:
        import verifiers.v1 as vf

        agents = vf.Agents(self.env.config, make=lambda name, spec: _AhaAgent(name, spec, self))
        await self.env.setup(agents)
        await self.env.run(self.task, agents)
        episode = vf.Episode(env=vf.EnvInfo(id=self.env.config.env_id), task=_trace_task(self.task),
                             traces=list(self.traces))
        await self.env.finalize(self.task, episode)
        self.traces = list(episode.traces)

    def _reward(self) -> float:
        return float(sum(trace.reward for trace in self.traces))


def _trace_task(task: Any) -> Any:
    import verifiers.v1 as vf

    return vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash)


class _AhaAgent:
    """A verifiers agent seat played by aha's policy: its turns are the driver's model turns."""

    def __init__(self, name: str, spec: Any, episode: VerifiersEpisode):
        self.name, self.spec, self.episode, self.trainable = name, spec, episode, True
        self.opened = False

    def interaction(self, task: Any) -> _AhaInteraction:
        if self.episode.traces or self.opened:
            raise RuntimeError("aha plays one conversation per episode (one token sequence per sample); this "
                               "environment opened a second interaction")
        self.opened = True
        return _AhaInteraction(self, task)

    async def run(self, task: Any) -> Any:
        """A single-agent rollout: the task's prompt, one model turn, scored."""
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace


class _AhaInteraction:
    """`vf.Interaction`'s surface (turn, trace), as an async context manager, over the episode's rendezvous."""

    def __init__(self, agent: _AhaAgent, task: Any):
        import verifiers.v1 as vf

        self.agent, self.task, self.over = agent, task, False
        self.trace = vf.Trace(task=_trace_task(task), agent=vf.AgentInfo(config=agent.spec, name=agent.name))
        self.opened = False

    async def __aenter__(self) -> _AhaInteraction:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.trace.stop_condition:
            self.trace.stop("user_closed")
        await self.task.score(self.trace)  # the task's @vf.reward / @vf.metric hooks (no runtime: none is used)
        self.trace.is_completed, self.trace.ok = True, exc[0] is None
        self.agent.episode.traces.append(self.trace)

    async def turn(self, message: Any = None) -> Any:
        import verifiers.v1 as vf

        if self.over:
            return vf.Segment(messages=[], terminated=True)
        messages = ([] if self.opened else _task_opening(self.task)) + _as_messages(message)
        if not messages:
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        self.opened = True
        self._record(messages, sampled=False)
        request = _Request(messages)
        await self.agent.episode.requests.put(request)
        answer = await request.answer
        if answer is _TERMINATED:
            self.over = True
            self.trace.stop("aha_limit")
            return vf.Segment(messages=[], terminated=True)
        reply = vf.AssistantMessage(content=answer)
        self._record([reply], sampled=True)
        return vf.Segment(messages=[reply])

    def _record(self, messages: list[Any], sampled: bool) -> None:
        import verifiers.v1 as vf
        from verifiers.v1.dialects import parse_message

        for message in messages:
            typed = parse_message(message) if isinstance(message, dict) else message
            parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
            self.trace.nodes.append(vf.MessageNode(parent=parent, message=typed, sampled=sampled))


def _task_opening(task: Any) -> list[Message]:
    data = task.data
    out = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    return out + _as_messages(data.prompt)


def _as_messages(message: Any) -> list[Message]:
    """A turn's input (None, text, or verifiers/wire messages) as plain chat messages."""
    if message is None:
        return []
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    out = []
    for m in message:
        if isinstance(m, dict):
            out.append({"role": m["role"], "content": m.get("content") or ""})
        else:
            from verifiers.v1.types import content_text

            out.append({"role": m.role, "content": content_text(m.content)})
    return out
