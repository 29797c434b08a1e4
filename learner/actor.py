"""LearnerActor: the Learner inside a Ray actor, with the resources its config asks for.

Nothing here is CPU-specific: Ray reserves `resources.num_cpus / num_gpus / tpu` chips, and inside the actor
`jax.devices()` are what Ray exposed (a TPU host's chips, or fake CPU devices when the caller's runtime_env sets
XLA_FLAGS). The learner then takes its `devices` slice of those. Adapters leave as numpy arrays through Ray's
object store (`lora_tensors`), so the rollout server never needs a shared filesystem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from learner.config import LearnerConfig


class LearnerWorker:
    """The actor body: builds the Learner in the actor process (JAX is imported there, not in the driver)."""

    def __init__(self, cfg: LearnerConfig, model_path: str, checkpoint_dir: str | None = None):
        import logging

        from learner.learner import Learner

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        self.learner = Learner(cfg, Path(model_path), Path(checkpoint_dir) if checkpoint_dir else None)

    def step(self, batch) -> dict[str, float]:
        return self.learner.step(batch)

    def lora_tensors(self) -> tuple[dict, dict]:
        return self.learner.lora_tensors()

    def export_lora(self, out_dir: str) -> str:
        return str(self.learner.export_lora(Path(out_dir)))

    def export_merged(self, out_dir: str) -> str:
        return str(self.learner.export_merged(Path(out_dir)))

    def save(self, step: int, extra: dict | None = None) -> None:
        self.learner.save(step, extra)

    def restore(self) -> tuple[int, dict]:
        return self.learner.restore()

    def devices(self) -> list[str]:
        """The learner's mesh devices, as strings (for logs and tests)."""
        return [str(d) for d in self.learner.mesh.devices.flat]


LearnerActor = ray.remote(LearnerWorker)


def start_learner_actor(cfg: LearnerConfig, model_path: Path, checkpoint_dir: Path | None = None,
                        runtime_env: dict[str, Any] | None = None, name: str | None = None):
    """Start a LearnerActor with the config's resources; `runtime_env` carries platform settings (e.g. XLA_FLAGS)."""
    r = cfg.resources
    options: dict[str, Any] = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus}
    if r.tpu:
        options["resources"] = {"TPU": r.tpu}
    if runtime_env:
        options["runtime_env"] = runtime_env
    if name:
        options["name"] = name
    return LearnerActor.options(**options).remote(cfg, str(model_path), str(checkpoint_dir) if checkpoint_dir else None)
