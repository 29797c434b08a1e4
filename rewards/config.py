"""Which rewards a run uses, their weights and parameters, what a failing reward does to the step, and the worker
pool that runs rewards given by import path.

A built-in reward's parameters are checked by building it at config-validation time, so a typo in `params` fails
when the YAML is loaded (naming the term and the field), not minutes later at the first scoring step. A reward by
import path (`fn`) is only checked for its form here: importing it runs user code, which happens in the pool's
worker processes when the run starts (rewards/pool.py), never in the driver.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from rewards.catalog import REWARDS, build_reward
from common.strict import Strict

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
"""`package.module:function` (the attribute may be dotted, e.g. `module:Class.method`)."""
TRL_ARGUMENTS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"})
"""Keyword arguments aha passes a reward by import path itself, as TRL's GRPOTrainer does: no param may take them."""
RESERVED_NAMES = frozenset({"total", "total_std", "errors"})
"""Metric names of the reward section itself (`reward/total`, `reward/errors`): no term may log under them."""


class RewardTerm(Strict):
    """One reward in the weighted sum: a built-in one by `name`, or the user's own by `fn`."""

    name: str | None = None
    """A reward of the catalogue (rewards.catalog.REWARDS): countdown, math_answer, format, repetition. With `fn`:
    the name it is logged under (`reward/<name>`; default: the function's name)."""
    fn: str | None = None
    """A reward function by import path, `package.module:function`, importable from PYTHONPATH or the run's working
    directory, with TRL's signature `f(prompts, completions, **columns) -> list[float | None]` (sync or async). It
    runs in a worker process (rewards.pool), one call per prompt's group of completions."""
    weight: float = 1.0
    """Multiplier in the total; the per-reward metrics are logged unweighted."""
    params: dict[str, Any] = {}
    """Built-in: keyword arguments of the reward's constructor (e.g. repetition `ngram`/`tiers`, format `think_tag`).
    `fn`: extra keyword arguments of every call (as functools.partial would bind them; they win over a data column
    of the same name)."""

    @model_validator(mode="after")
    def _check(self) -> RewardTerm:
        if self.fn is None:
            if self.name is None:
                raise ValueError("a reward term needs `name` (a built-in reward) or `fn` (package.module:function)")
            if self.name not in REWARDS:
                raise ValueError(f"unknown reward {self.name!r}; choose one of {sorted(REWARDS)}, or give your own "
                                 "function as fn: package.module:function")
            return self
        if not IMPORT_PATH.match(self.fn):
            raise ValueError(f"fn {self.fn!r} is not an import path like package.module:function")
        taken = sorted(TRL_ARGUMENTS & set(self.params))
        if taken:
            raise ValueError(f"fn {self.fn}: params {taken} are arguments aha passes itself (TRL's); rename them")
        return self

    @property
    def label(self) -> str:
        """The name this term is logged under (`reward/<label>`)."""
        if self.name is not None:
            return self.name
        return (self.fn or "").rsplit(":", 1)[1].rsplit(".", 1)[-1]


class RewardPoolConfig(Strict):
    """The worker processes that run rewards given by import path (`fn` terms); built-in rewards run in-process."""

    workers: int = Field(2, ge=1, le=64)
    """Worker processes; the groups of one step are scored in parallel across them."""
    timeout_s: float = Field(30.0, gt=0)
    """Longest one call (one prompt's group of completions) may take; past it the worker is killed and replaced,
    and the call's samples score per rewards.on_error."""
    memory_mb: int = Field(2048, ge=64)
    """Memory limit of each worker (RLIMIT_DATA: heap and anonymous mappings, imports included); a call that runs
    past it fails as `memory` and the worker is replaced."""
    max_tasks: int = Field(64, ge=4)
    """Processes and threads the workers and everything they start may run together (RLIMIT_NPROC, and pids.max
    where the pool has a cgroup v1): past it, a fork or a new thread fails (EAGAIN), so a fork bomb stays small.
    RLIMIT_NPROC counts per user: as root the workers run as `user`, and the bound is that user's tasks when the pool
    starts plus this; otherwise it is your own user's tasks then plus this (what you start later counts too)."""
    max_file_mb: int = Field(1024, ge=1)
    """Largest file a worker may write (RLIMIT_FSIZE); a write past it fails (EFBIG)."""
    max_open_files: int = Field(256, ge=32)
    """Files and sockets a worker may hold open at once (RLIMIT_NOFILE)."""
    network: bool = False
    """Whether the workers may use the network. False: each worker runs in a network namespace of its own with no
    interface up, so a reward can reach neither the internet nor the run's engines, the driver or any service on this
    host (a connect fails). True: the host's network, for a reward that calls a remote sandbox or a judge API; the
    pool says which at start."""
    user: str | int = "nobody"
    """When the driver runs as root: the user (a name or a number) the workers run as, so that a reward cannot
    raise its own limits, signal the driver or write the run directory. It must be able to read the files your
    reward reads by path, and the folders of the Python path and the working directory themselves (their parents
    need not be reachable: the worker opens those folders before it switches). "root" keeps root and gives up
    those three guarantees. Ignored when the driver is not root (the workers run as its user)."""


class RewardsConfig(Strict):
    """The reward terms, the error policy and the pool for rewards by import path."""

    terms: list[RewardTerm] = Field(min_length=1)
    """Rewards summed (weighted) into each sample's total."""
    on_error: Literal["zero", "fail"] = "zero"
    """A reward that fails (raises, returns something other than numbers, or as an `fn` term times out, exits its
    process or runs out of memory): "zero" logs one line, scores the samples it failed on 0 for that term and counts
    it (reward/errors and reward/errors/<kind>), and the run goes on; "fail" fails the step."""
    solved_by: str | None = None
    """The term whose value >= 1.0 counts a sample as solved in evals (accuracy, pass@k); None: countdown or
    math_answer when the run has one (otherwise evals log rewards only)."""
    pool: RewardPoolConfig = RewardPoolConfig()
    """Worker processes for `fn` terms (started only when there is one)."""

    @model_validator(mode="after")
    def _check_terms(self) -> RewardsConfig:
        labels = [term.label for term in self.terms]
        for label in set(labels):
            if labels.count(label) > 1:
                raise ValueError(f"reward {label!r} appears {labels.count(label)} times in terms; merge them into one"
                                 " (or give an fn term its own name)")
            if label in RESERVED_NAMES:
                raise ValueError(f"reward name {label!r} is taken by the reward/{label} metric; set the term's name")
        for index, term in enumerate(self.terms):
            if term.fn is None:
                build_reward(term.name or "", term.params, f"rewards.terms[{index}]")
        if self.solved_by is not None and self.solved_by not in labels:
            raise ValueError(f"rewards.solved_by {self.solved_by!r} is not one of the terms {labels}")
        return self
