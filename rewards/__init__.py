"""Verifiable rewards for GRPO: pure, picklable scorers of hostile model output (no jax, torch or vllm here)."""

from rewards.config import RewardsConfig, RewardTerm
from rewards.catalog import REWARDS
from rewards.registry import RewardResult, RewardSet, score_batch, setup_rewards
from rewards.types import RewardFn, Sample

__all__ = [
    "REWARDS",
    "RewardFn",
    "RewardResult",
    "RewardSet",
    "RewardTerm",
    "RewardsConfig",
    "Sample",
    "score_batch",
    "setup_rewards",
]
