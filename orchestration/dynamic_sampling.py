"""DAPO's dynamic sampling with refill: draw prompts until a step's batch holds enough groups whose rewards differ.

A group whose samples all score the same (all solved, all failed) has advantage 0 under every GRPO variant, so it
adds nothing to the update but its cost. `train.dynamic_sampling` keeps drawing: the first draw is
train.prompts_per_step prompts, as without it; each refill draws the groups still missing divided by the share of
this step's drawn groups that varied (at most prompts_per_step), until prompts_per_step varying groups are in hand
or `max_draws` draws are spent. Surplus varying groups are dropped, so a step's batch keeps its configured size.
Short of a full batch at the bound, the step trains on the varying groups it has; with none, on its first draw
(every advantage 0: the update moves nothing, and the step's metrics still say how the policy does).

Exactness: a refill continues the prompt index of the step's request seeds ((train.seed, step, index), index
counting over all draws of the step), and the data position a checkpoint records is the stream's after the last
draw, so a resumed run redraws every draw of a step as the uninterrupted run did. The draws are sequential, so
this module needs nothing of async mode: a step generated ahead is filled the same way, with the adapter at hand.

Metrics: `dynamic/draws` (draws this step), `dynamic/drawn_groups`, `dynamic/varying_groups` (before trimming),
`dynamic/kept_groups` (trained on), `dynamic/filtered_frac` (drawn groups left out for equal rewards) and
`dynamic/bound_hit` (1 when max_draws ended the step short of a full batch).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rewards.registry import RewardResult
from common.sampling import Completion
from tasks import Prompt

log = logging.getLogger(__name__)


@dataclass
class Drawn:
    """Prompts drawn in one step (one draw, or several joined), their groups of completions and their scores."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    texts: list[str]
    """Each prompt as the model read it (chat template applied; an episode's opening)."""
    completions: list[list[Completion]]
    rewards: list[RewardResult]
    """One per draw: per-reward values, errors, reward metrics."""
    totals: list[float]
    """Per-sample weighted reward, in group order (an episode's includes its environment's reward)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of the draw's phases (generate, score), summed over joined draws."""
    restarts: int = 0
    """Engine restarts during the draws' generation."""

    def group_totals(self) -> list[list[float]]:
        flat, out, start = self.totals, [], 0
        for group in self.completions:
            out.append(flat[start : start + len(group)])
            start += len(group)
        return out

    def varying(self) -> list[int]:
        """Indices of the groups whose rewards are not all equal (the only ones with a non-zero advantage)."""
        return [g for g, values in enumerate(self.group_totals()) if np.ptp(np.asarray(values, np.float64)) > 0]

    @classmethod
    def join(cls, draws: list[Drawn]) -> Drawn:
        seconds: dict[str, float] = {}
        for d in draws:
            for key, value in d.seconds.items():
                seconds[key] = seconds.get(key, 0.0) + value
        return cls([p for d in draws for p in d.prompts], [i for d in draws for i in d.prompt_ids],
                   [t for d in draws for t in d.texts], [c for d in draws for c in d.completions],
                   [r for d in draws for r in d.rewards], [t for d in draws for t in d.totals], seconds,
                   sum(d.restarts for d in draws))

    def take(self, groups: list[int]) -> Drawn:
        """The given groups, in that order (rewards and timings stay those of every draw)."""
        totals = self.group_totals()
        return Drawn([self.prompts[g] for g in groups], [self.prompt_ids[g] for g in groups],
                     [self.texts[g] for g in groups], [self.completions[g] for g in groups], self.rewards,
                     [t for g in groups for t in totals[g]], self.seconds, self.restarts)


def refill_size(missing: int, drawn: int, varying: int, quota: int) -> int:
    """Prompts the next refill draws: the groups missing over the varying share seen so far, 1..quota."""
    if varying == 0:
        return quota
    return max(1, min(quota, math.ceil(missing * drawn / varying)))


def fill_batch(draw: Callable[[int, int], Drawn], quota: int, max_draws: int,
               step: int = 0) -> tuple[Drawn, list[int], dict[str, float]]:
    """Draw until `quota` varying groups are in hand or `max_draws` draws are spent.

    `draw(count, first_index)` draws `count` prompts whose request seeds count from `first_index`. Returns every
    draw joined, the groups to train on (indices into it) and the `dynamic/` metrics.
    """
    draws: list[Drawn] = []
    varying: list[int] = []
    drawn = 0
    while len(draws) < max_draws and len(varying) < quota:
        count = quota if not draws else refill_size(quota - len(varying), drawn, len(varying), quota)
        batch = draw(count, drawn)
        varying += [drawn + g for g in batch.varying()]
        draws.append(batch)
        drawn += count
    short = len(varying) < quota
    kept = varying[:quota] if varying else list(range(quota))
    if short:
        log.info("step %d: %d of %d groups with varying rewards after %d draws (train.dynamic_sampling.max_draws); "
                 "training on %s", step, len(varying), quota, len(draws),
                 "them" if varying else "the first draw (no group varied)")
    metrics = {"dynamic/draws": len(draws), "dynamic/drawn_groups": drawn, "dynamic/varying_groups": len(varying),
               "dynamic/kept_groups": min(len(varying), quota), "dynamic/filtered_frac": 1 - len(varying) / drawn,
               "dynamic/bound_hit": int(short)}
    return Drawn.join(draws), kept, metrics
