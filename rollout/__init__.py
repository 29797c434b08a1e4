"""Rollout: generate completions with the current policy from a real inference server (vLLM or SGLang-JAX).

The driver uses `rollout.handle.Rollout`; configs and data types are re-exported here. Importing this package never
imports vllm, torch, jax or ray: the engine runs as a subprocess from its own environment.
"""

from rollout.config import ClientConfig, RolloutConfig, VllmConfig
from common.sampling import Completion, SamplingParams

__all__ = ["ClientConfig", "Completion", "RolloutConfig", "SamplingParams", "VllmConfig"]
