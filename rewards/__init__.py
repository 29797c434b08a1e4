"""Verifiable rewards for GRPO: pure, picklable scorers of hostile model output (no jax, torch or vllm here), and the
sandboxed worker pool that runs a user's own reward functions (TRL's signature) by import path."""

from rewards.config import RewardsConfig, RewardTerm
from rewards.catalog import REWARDS
from rewards.registry import RewardResult, RewardSet, reward_metrics, score_batch, setup_rewards
from rewards.types import RewardFn, Sample, TrainingProgress

__all__ = [
    "REWARDS",
    "RewardFn",
    "RewardResult",
    "RewardSet",
    "RewardTerm",
    "RewardsConfig",
    "Sample",
    "TrainingProgress",
    "reward_metrics",
    "score_batch",
    "setup_rewards",
]
