"""What a learner's callers name about its adapters, without JAX: the GRPO run's own adapter and the AdamW numbers of
an optim_step. The driver and the training service import these; importing learner/adapters.py instead would load
JAX, Flax, Optax and Qwix into processes that hold no weights (`import learner.handle` 2.4 s -> 0.7 s under
`-X importtime`, docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import dataclass

POLICY = "policy"
"""The learner's own adapter: the one a GRPO run trains and checkpoints."""


@dataclass(frozen=True)
class AdamParams:
    """One optim_step's AdamW numbers (the Tinker API's AdamParams; grad_clip_norm 0 = no clipping)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self) -> None:
        if not (self.learning_rate >= 0 and 0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0
                and self.weight_decay >= 0 and self.grad_clip_norm >= 0):
            raise ValueError(f"AdamParams {self}: need learning_rate >= 0, 0 <= beta1, beta2 < 1, eps > 0, "
                             "weight_decay >= 0 and grad_clip_norm >= 0")
