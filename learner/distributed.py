"""Multi-controller JAX for a learner that spans several processes (one per host of a TPU slice).

Every process runs the same program on its own copy of the batch (SPMD): `jax.distributed.initialize` joins them
into one runtime whose `jax.devices()` are all processes' devices, so the learner's mesh spans every host.
Two things then differ from one process, and both live here so `Learner` reads the same either way:
- host -> mesh: `put_global` builds a globally sharded array from the host copy each process holds
  (`jax.make_array_from_callback`: each process fills only its own shards, no cross-host check or copy);
- mesh -> host: `to_host` gathers an array whose shards live on other processes (LoRA weights sharded over
  `fsdp`, per-row logprobs). The gather is a collective: every process must call it.
With one process both are plain `device_put` / `np.asarray`.
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)


def initialize(coordinator: str, num_processes: int, process_id: int, timeout_s: int = 300) -> None:
    """Join the learner's JAX processes (call before anything touches a JAX device); blocks until all joined."""
    jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=timeout_s)
    log.info("JAX process %d/%d joined %s: %d local, %d global devices", process_id, num_processes, coordinator,
             jax.local_device_count(), jax.device_count())


def is_primary() -> bool:
    """True in the process that writes files and answers for the group (process 0)."""
    return jax.process_index() == 0


def put_global(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array from the full host copy every process holds; each process places only its own shards."""
    host = np.asarray(host)
    if sharding.is_fully_addressable:
        return jax.device_put(host, sharding)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def to_host(x: jax.Array) -> np.ndarray:
    """The whole value of `x` as numpy in every process (a collective when `x` has shards on other processes)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def tree_to_host(tree):
    """`to_host` on every leaf (same leaf order in every process, so the collectives line up)."""
    return jax.tree.map(to_host, tree)
