"""Join or start Ray, and start the run's two actors: the rollout server and the learner.

On a TPU VM each actor asks for its own chips through Ray's `TPU` resource (from its sub-config), so the learner
and the engine never share a device; here on CPU they are two processes with logical CPUs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ray

from learner.config import LearnerConfig
from orchestration.config import RayConfig, RunConfig, part_config
from orchestration.placement import reserve_hosts
from orchestration.prepare_model import cache_dir
from orchestration.resources import check_cluster_fits
from rollout.config import RolloutConfig

log = logging.getLogger(__name__)
COMPILE_CACHE_BYTES = 2 << 30  # learner.compile_cache's bound; JAX evicts the least recently used entries past it


def compile_cache_dir() -> Path:
    """Where learner processes keep compiled step pieces (JAX's persistent compilation cache)."""
    return cache_dir() / "jax_cache" / "learner"


def learner_runtime_env(cfg: RunConfig) -> dict | None:
    """The learner processes' runtime_env: JAX's own cache variables when learner.compile_cache is on."""
    if not cfg.learner.compile_cache:
        return None
    return {"env_vars": {"JAX_COMPILATION_CACHE_DIR": str(compile_cache_dir()),
                         "JAX_COMPILATION_CACHE_MAX_SIZE": str(COMPILE_CACHE_BYTES)}}


def connect(cfg: RunConfig) -> bool:
    """Join the configured cluster, the `ray job submit` cluster (RAY_ADDRESS), or start a private local one.

    Returns True when this process started the cluster (and so should shut it down).
    """
    ray_cfg: RayConfig = cfg.ray
    address = ray_cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        log.info("joined Ray cluster at %s", address)
        return False
    # address="local" always starts a new cluster: a bare ray.init() would silently attach to any cluster already
    # running on this machine without shipping our code to it.
    needed = cfg.rollout.resources.num_cpus * cfg.rollout.replicas + cfg.learner.resources.num_cpus * cfg.learner.hosts
    if cfg.judge_engine is not None:
        needed += cfg.judge_engine.resources.num_cpus
    num_cpus = ray_cfg.num_cpus or max(int(needed) + 1, os.cpu_count() or 1)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    log.info("started a local Ray cluster (%d logical CPUs)", num_cpus)
    return True


def start_learner(cfg: RunConfig, checkpoint_dir: Path):
    """The learner actor (or, with learner.hosts > 1, the group of learner processes behind one handle); its model
    loads in the background while the rollout server starts."""
    from learner.group import start_learner

    check_cluster_fits(cfg)  # the first actor: a run the cluster cannot hold fails in seconds, not waits forever
    placement = reserve_hosts(cfg.learner.resources, cfg.learner.hosts, "learner", "hosts")
    options = cfg.learner.resources.ray_options()
    if runtime_env := learner_runtime_env(cfg):
        options["runtime_env"] = runtime_env
    return start_learner(part_config(cfg.learner, LearnerConfig), cfg.model.resolved_path, checkpoint_dir, options,
                         placement=placement)


def start_rollout(cfg: RunConfig):
    """The rollout server behind its Ray actor (or rollout.replicas of them behind one fleet handle); blocks until
    every engine answers /health."""
    from rollout.fleet import setup_rollout

    placement = reserve_hosts(cfg.rollout.resources, cfg.rollout.replicas, "rollout", "replicas")
    rollout = setup_rollout(part_config(cfg.rollout, RolloutConfig), cfg.model.resolved_path, placement,
                            cfg.rollout.resources.ray_options())
    base_url = rollout.start()
    log.info("rollout server (%s, %d replica(s)) ready at %s", cfg.rollout.backend.kind, cfg.rollout.replicas,
             base_url)
    return rollout
