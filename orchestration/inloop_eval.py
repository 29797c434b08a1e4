"""In-loop held-out eval: every `eval.every` steps, score the held-out prompts with the adapter just pushed.

It runs through the training engine (the adapter the loop pushed is the one on the server), so no second server
and no adapter copy: the cost is `eval.prompts x eval.k` samples of generation. The eval set and the scoring are
the ones `python -m orchestration.cli.eval` uses (tasks/heldout.py), so the per-step curve and the final
base-vs-trained numbers measure the same thing. Called once at the end of a step, after its metrics are logged.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from orchestration import stats
from tasks import DataConfig, Prompt
from tasks.heldout import eval_prompts, eval_sampling, score_policy
from orchestration.problem import run_limits

if TYPE_CHECKING:
    from orchestration.config.schema import RunConfig
    from orchestration.loop import Parts

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _prompts(data: DataConfig, limit: int) -> tuple[Prompt, ...]:
    # Built once per run, not once per eval: the set is a pure function of the (frozen, hashable) data config.
    return tuple(eval_prompts(data, limit))


_ENV_PROMPTS: dict[tuple, tuple[Prompt, ...]] = {}


def held_out(cfg: RunConfig, parts: Parts) -> tuple[Prompt, ...]:
    """The eval prompts: data.task's, or the run's environment's own held-out rows (built once per environment)."""
    if parts.environment is None:
        return _prompts(cfg.data, cfg.eval.prompts)
    key = (cfg.data, cfg.eval.prompts, id(parts.environment))  # an environment need not be hashable
    if key not in _ENV_PROMPTS:
        _ENV_PROMPTS[key] = tuple(eval_prompts(cfg.data, cfg.eval.prompts, environment=parts.environment))
    return _ENV_PROMPTS[key]


def is_eval_step(cfg: RunConfig, step: int) -> bool:
    """Every eval.every steps and at the last step (a call at step 0, before any update, scores the base policy)."""
    every = cfg.eval.every
    return every > 0 and (step % every == 0 or step == cfg.train.steps)


def maybe_eval(cfg: RunConfig, parts: Parts, step: int) -> dict[str, float] | None:
    """If `step` is an eval step, score the held-out prompts with the current adapter, log and return the metrics."""
    if not is_eval_step(cfg, step):
        return None
    t0 = time.perf_counter()
    e = cfg.eval
    params = eval_sampling(cfg.rollout.sampling, e.k, e.temperature, e.max_tokens)
    prompts = held_out(cfg, parts)
    scores = score_policy(parts.rollout, parts.renderer, parts.rewards, prompts, params,
                          environment=parts.environment, limits=run_limits(cfg))
    metrics: dict[str, float] = {"eval/reward": float(scores.totals.mean()),
                                 "eval/completion_len_mean": float(scores.lengths.mean())}
    if scores.solved is not None:
        for key, iv in stats.solved_intervals(scores.solved).items():
            metrics.update({f"eval/{key}": iv.value, f"eval/{key}_low": iv.low, f"eval/{key}_high": iv.high})
    else:
        log.warning("eval at step %d: no task reward (countdown, math_answer or rewards.solved_by) in the config, so "
                    "no accuracy; logging eval/reward only", step)
    metrics.update({f"eval/reward_{n}": float(np.nanmean(v)) for n, v in scores.per_name.items()
                    if not np.isnan(v).all()})
    metrics["timing/eval"] = time.perf_counter() - t0
    parts.metrics.log_eval(step, metrics)
    return metrics
