"""LearnerActor: the Learner inside a Ray actor, with the Ray options the driver gives it (learner/handle.py is
how the driver calls it).

Nothing here is CPU-specific: Ray reserves what the driver asks (the run config's `learner.resources`: CPUs, GPUs,
`TPU` chips), and inside the actor `jax.devices()` are what Ray exposed (a TPU host's chips, or fake CPU devices
when the driver's runtime_env sets XLA_FLAGS). The learner then takes its `devices` slice of those. Adapters leave
as numpy arrays through Ray's object store (`save_for_sampler`), so the rollout server never needs a shared filesystem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from common.affinity import pin_process
from learner.config import LearnerConfig

# The Learner's methods a driver may call (learner/handle.py wraps each under the same name).
PRIMITIVES = ("forward", "forward_backward", "optim_step", "save_for_sampler", "export", "add_adapter",
              "drop_adapter", "save_state", "load_state", "save", "restore")


class LearnerWorker:
    """The actor body: builds the Learner in the actor process (JAX is imported there, not in the driver).

    With `num_processes > 1` it is one process of a multi-host learner (learner/group.py): the Learner is built
    only in `join`, after `jax.distributed.initialize`, since JAX must know all processes before its first device
    use. Every process runs every method (SPMD); what leaves the group (tensors, files) comes from process 0.
    """

    def __init__(self, cfg: LearnerConfig, model_path: str, checkpoint_dir: str | None = None,
                 num_processes: int = 1):
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        if cfg.cpu_cores:  # every thread of the actor's process, Ray's own included, before JAX starts its pools
            pin_process(cfg.cpu_cores)
        self._args = (cfg, Path(model_path), checkpoint_dir)  # a local path or a storage URI (gs://...)
        self.learner = None
        if num_processes == 1:
            self._build()

    def _build(self) -> None:
        from learner.learner import Learner

        self.learner = Learner(*self._args)

    def coordinator_address(self) -> str:
        """host:port for jax.distributed's coordinator, on this actor's node (called on process 0 only)."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def join(self, coordinator: str, num_processes: int, process_id: int) -> None:
        """Join the learner's JAX processes, then build the Learner on the global mesh."""
        from learner.distributed import initialize

        initialize(coordinator, num_processes, process_id)
        self._build()

    def call(self, name: str, *args: Any) -> Any:
        """Run the Learner's primitive `name` (learner/learner.py; learner/handle.py names each one once).

        Process 0 alone answers with what leaves the learner (the adapter's tensors, an exported folder); the
        others take part in the collective gather and answer None."""
        from learner.distributed import is_primary

        if name not in PRIMITIVES:
            raise ValueError(f"the learner has no primitive {name!r}; it has {PRIMITIVES}")
        if name == "export" and not is_primary():  # the gather is collective; one process writes
            self.learner.save_for_sampler(*args[1:])
            return None
        out = getattr(self.learner, name)(*args)
        return out if name != "save_for_sampler" or is_primary() else None

    def node(self) -> str:
        """Where this process runs: its Ray node's address and the host name (for placement logs and errors)."""
        import socket

        return f"{ray.util.get_node_ip_address()} ({socket.gethostname()})"

    def devices(self) -> list[str]:
        """The learner's mesh devices, as strings (for logs and tests)."""
        return [str(d) for d in self.learner.mesh.devices.flat]


LearnerActor = ray.remote(LearnerWorker)


def start_learner_actor(cfg: LearnerConfig, model_path: Path, checkpoint_dir: str | None = None,
                        actor_options: dict[str, Any] | None = None, num_processes: int = 1):
    """Start a LearnerActor. `actor_options` are the driver's Ray options for it: resources (`num_cpus`, `num_gpus`,
    `resources={"TPU": chips}`), `runtime_env` (platform settings, e.g. XLA_FLAGS), `scheduling_strategy`.

    `num_processes > 1`: one process of a multi-host learner, built when `join` is called (learner/group.py).
    """
    options = {"num_cpus": 1, **(actor_options or {})}
    return LearnerActor.options(**options).remote(cfg, str(model_path), str(checkpoint_dir) if checkpoint_dir else None,
                                                  num_processes)
