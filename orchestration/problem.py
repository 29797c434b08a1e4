"""A run's problem side from its config: the rows of a split, the environment (if any) and the reward set.

One place for what train, eval, the in-loop eval and the benches build alike: the rows are the environment's own
when it has them (the guessing game), else `data.task`'s; the rewards are the configured terms, or none when an
environment scores its episodes itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.episodes import Limits
from rewards.registry import RewardSet, setup_rewards
from tasks import Prompt
from tasks.environments.base import Environment
from tasks.environments.catalog import environment_rows, setup_environment

if TYPE_CHECKING:
    from orchestration.config.schema import RunConfig


def run_environment(cfg: RunConfig) -> Environment | None:
    """The run's environment, built (imports a user's or verifiers' module), or None for single-turn runs."""
    return None if cfg.environment is None else setup_environment(cfg.environment)


def run_rows(cfg: RunConfig, environment: Environment | None, split: str) -> list[Prompt]:
    """The rows of `split` ("train" or "eval")."""
    return environment_rows(cfg.data, environment, split)


def run_rewards(cfg: RunConfig) -> RewardSet:
    """The configured reward terms (an empty set when the run has none: its environment scores the episodes)."""
    return RewardSet([], [], "zero") if cfg.rewards is None else setup_rewards(cfg.rewards)


def run_limits(cfg: RunConfig) -> Limits | None:
    """The limits of one episode (None for single-turn runs)."""
    env = cfg.environment
    if env is None:
        return None
    return Limits(env.max_turns, env.max_episode_tokens, env.step_timeout_s, cfg.rollout.backend.max_model_len,
                  cfg.rewards.on_error if cfg.rewards is not None else "zero")
