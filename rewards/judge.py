"""LLM-as-judge reward: a model grades each sample against a rubric, served by one of our own engines.

The rubric is a template (`{prompt}`, `{completion}`, `{reference[...]}`) rendered per sample; the judge's reply
is parsed strictly: the reply, stripped of surrounding whitespace (or the first group of `pattern`, which must
match the whole stripped reply), must be one of the `grades`' labels, and the sample scores that label's value. Any
other reply is malformed and scores per `rewards.on_error` (0 with an error line, or a failed step), as a raising
reward does: a judge that rambles is never read as a grade by guessing.

The judge is batched (one engine call for a batch's uncached samples, sent concurrently by the rollout client),
cached per (prompt, completion) (a sample drawn again, e.g. by a later step, costs no request), and reproducible:
each request's seed comes from a hash of what it grades, so the same sample gets the same grade in any batch, on
any step, after a resume.

Which engine serves it is the config's (`engine: policy`: the training engine with the base model, no adapter;
`engine: judge`: a separate engine with its own model, `judge_engine:` in the run config). This package never
imports orchestration: the driver builds a `JudgeEngine` and `bind`s it (orchestration/judge.py). A judge reward
therefore lives on the driver, where the engine's client is; it is not shipped to Ray workers.
"""

from __future__ import annotations

import collections
import hashlib
import re
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field, field_validator, model_validator

from common.strict import Strict
from common.sampling import SamplingParams
from rewards.types import Sample

TEMPLATE_FIELDS = ("prompt", "completion", "reference")


class MalformedGrade(ValueError):
    """The judge replied something that is not one of the grades."""


@dataclass(frozen=True)
class JudgeReply:
    """One judge answer, with its token counts (for the judge's cost metrics)."""

    text: str
    prompt_tokens: int
    completion_tokens: int


class JudgeEngine(Protocol):
    """What a judge reward needs of an engine; orchestration/judge.py builds one over a rollout server."""

    def complete(self, prompts: Sequence[str | list[dict[str, str]]], params: SamplingParams,
                 seeds: list[int]) -> list[JudgeReply | Exception]:
        """One reply per prompt (a chat message list or raw text); a prompt the engine cannot take (too long)
        gets an exception in its place, so one bad sample does not fail the batch."""
        ...


class JudgeParams(Strict):
    """Params of the `judge` reward term."""

    template: str = Field(min_length=1)
    """The rubric sent to the judge, a str.format template over {prompt} (the rendered prompt text), {completion}
    (the assistant's turn) and {reference} (the task data, e.g. {reference[target]})."""
    system_prompt: str | None = None
    """chat only: the judge's system message (None: the judge model's default)."""
    chat: bool = True
    """Send the rubric as a user message through the judge model's chat template; False: as raw text."""
    grades: dict[str, float] = {"0": 0.0, "1": 1.0}
    """The replies a judge may give, each with the score it means; anything else is malformed."""
    pattern: str | None = None
    """A regex that must match the whole stripped reply; its first group is the grade (e.g. `GRADE: (\\d)`).
    None: the whole stripped reply is the grade."""
    engine: Literal["policy", "judge"] = "policy"
    """policy: the training engine with the base model (no adapter); judge: a separate engine with its own model,
    configured under the run config's `judge_engine:`."""
    sampling: SamplingParams = SamplingParams(temperature=0.0, max_tokens=8)
    """The judge's sampling (n must be 1); greedy by default. A constrained reply can be asked of engines that
    support it through `extra` (vLLM: {"structured_outputs": {"choice": ["0", "1"]}} or allowed_token_ids)."""
    cache_size: int = Field(100_000, ge=0)
    """Replies kept per (prompt, completion), least recently used out first; 0 = no cache."""

    @field_validator("template")
    @classmethod
    def _fields_known(cls, template: str) -> str:
        names = {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}
        if unknown := sorted(names - set(TEMPLATE_FIELDS)):
            raise ValueError(f"template names {unknown}; it may use {{prompt}}, {{completion}}, {{reference[...]}}")
        if "completion" not in names:
            raise ValueError("template never shows the judge the {completion} it grades; add {completion}")
        return template

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                groups = re.compile(pattern).groups
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a regex: {exc}") from None
            if groups < 1:
                raise ValueError(f"pattern {pattern!r} has no group; put the grade in ( )")
        return pattern

    @model_validator(mode="after")
    def _check(self) -> JudgeParams:
        if not self.grades:
            raise ValueError("grades is empty; give the replies the judge may give, e.g. {'0': 0.0, '1': 1.0}")
        if self.sampling.n != 1:
            raise ValueError(f"sampling.n ({self.sampling.n}) must be 1: one grade per sample")
        return self


class JudgeReward:
    """The `judge` reward term: batched, strictly parsed, cached; `bind` an engine before scoring."""

    __name__: ClassVar[str] = "judge"

    def __init__(self, **params: Any):
        self.params = JudgeParams(**params)
        self._pattern = re.compile(self.params.pattern) if self.params.pattern else None
        self.engine: JudgeEngine | None = None
        self._cache: collections.OrderedDict[str, JudgeReply] = collections.OrderedDict()
        self._counters = self._zero()

    def bind(self, engine: JudgeEngine) -> None:
        """Give the reward the engine it asks (done by the driver once the engines are up)."""
        self.engine = engine

    def __getstate__(self) -> dict:
        # The engine's client belongs to the process that made it; a copy elsewhere must be bound again.
        return {**self.__dict__, "engine": None}

    def __call__(self, sample: Sample) -> float:
        [value] = self.score_batch([sample])
        if isinstance(value, Exception):
            raise value
        return value

    # ---- scoring -------------------------------------------------------------------------------------------
    def score_batch(self, samples: Sequence[Sample]) -> list[float | Exception]:
        """A score per sample, or the exception that stands for it (malformed grade, prompt too long)."""
        if self.engine is None:
            raise RuntimeError("the judge reward has no engine; the training loop binds one "
                               "(orchestration/judge.py setup_judge)")
        keys = [self._key(s) for s in samples]
        todo = {k: s for k, s in zip(keys, samples) if k not in self._cache}
        self._counters["judge/cache_hits"] += len(samples) - len(todo)
        replies: dict[str, JudgeReply | Exception] = {}
        if todo:
            t0 = time.perf_counter()
            got = self.engine.complete([self.prompt(s) for s in todo.values()], self.params.sampling,
                                       [self._seed(k) for k in todo])
            self._counters["judge/seconds"] += time.perf_counter() - t0
            replies = dict(zip(todo, got, strict=True))
            for key, reply in replies.items():
                if isinstance(reply, JudgeReply):
                    self._counters["judge/requests"] += 1
                    self._counters["judge/prompt_tokens"] += reply.prompt_tokens
                    self._counters["judge/completion_tokens"] += reply.completion_tokens
                    self._remember(key, reply)
        out: list[float | Exception] = []
        for key in keys:
            reply = replies[key] if key in replies else self._cache[key]
            if key in self._cache:
                self._cache.move_to_end(key)  # least recently *used* leaves first
            try:
                out.append(reply if isinstance(reply, Exception) else self.parse(reply.text))
            except MalformedGrade as exc:
                self._counters["judge/malformed"] += 1
                out.append(exc)
        return out

    def prompt(self, sample: Sample) -> str | list[dict[str, str]]:
        """The judge's input for one sample: chat messages, or raw text when `chat` is off."""
        p = self.params
        rubric = p.template.format(prompt=sample.prompt, completion=sample.completion, reference=sample.reference)
        if not p.chat:
            return rubric
        system = [{"role": "system", "content": p.system_prompt}] if p.system_prompt is not None else []
        return [*system, {"role": "user", "content": rubric}]

    def parse(self, reply: str) -> float:
        """The score of a reply; MalformedGrade unless it is exactly one of the grades."""
        text = reply.strip()
        if self._pattern is not None:
            match = self._pattern.fullmatch(text)
            text = match.group(1).strip() if match and match.group(1) is not None else None
        if text is None or text not in self.params.grades:
            raise MalformedGrade(f"judge replied {reply[:80]!r}, not one of the grades {sorted(self.params.grades)}"
                                 + (f" (pattern {self.params.pattern!r})" if self.params.pattern else ""))
        return float(self.params.grades[text])

    def take_metrics(self) -> dict[str, float]:
        """The judge's counters since the last call (additive: a step sums those of its draws)."""
        out, self._counters = self._counters, self._zero()
        return out

    # ---- helpers -------------------------------------------------------------------------------------------
    @staticmethod
    def _zero() -> dict[str, float]:
        return dict.fromkeys(("judge/requests", "judge/cache_hits", "judge/malformed", "judge/seconds",
                              "judge/prompt_tokens", "judge/completion_tokens"), 0.0)

    @staticmethod
    def _key(sample: Sample) -> str:
        return hashlib.blake2b(f"{len(sample.prompt)}:{sample.prompt}{sample.completion}".encode(),
                               digest_size=16).hexdigest()

    @staticmethod
    def _seed(key: str) -> int:
        return int(key[:8], 16) >> 1  # 31 bits: the engines' signed 32-bit seed

    def _remember(self, key: str, reply: JudgeReply) -> None:
        if self.params.cache_size == 0:
            return
        self._cache[key] = reply
        self._cache.move_to_end(key)
        while len(self._cache) > self.params.cache_size:
            self._cache.popitem(last=False)
