"""Join or start Ray, and start the run's two actors: the rollout server and the learner.

On a TPU VM each actor asks for its own chips through Ray's `TPU` resource (from its sub-config), so the learner
and the engine never share a device, and starts with the libtpu variables of its share (orchestration/cluster/tpu_env.py):
its own port and bounds, so runtimes that share a host coexist. Here on CPU they are two processes with logical CPUs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ray

from learner.config import LearnerConfig
from orchestration.config.schema import RayConfig, RunConfig, part_config
from orchestration.cluster.local_ray import start_local_ray
from orchestration.console import ray_init_options
from orchestration.cluster.placement import bundle_hosts, host_chip_coords, reserve_engines, reserve_learner
from common.model_cache import cache_dir
from orchestration.cluster.resources import check_cluster_fits
from orchestration.cluster.tpu_env import engine_envs, generation_of, learner_envs
from orchestration.cluster.tpu_settle import settle_chip_bounds
from rollout.config import RolloutConfig

log = logging.getLogger(__name__)
COMPILE_CACHE_BYTES = 2 << 30  # learner.compile_cache's bound; JAX evicts the least recently used entries past it


def compile_cache_dir() -> Path:
    """Where learner processes keep compiled step pieces (JAX's persistent compilation cache)."""
    return cache_dir() / "jax_cache" / "learner"


def learner_runtime_env(cfg: RunConfig) -> dict | None:
    """The learner processes' runtime_env: JAX's own cache variables when learner.compile_cache is on, and
    learner.env (each process's TPU variables go in between, `learner_process_env`)."""
    env = {"JAX_COMPILATION_CACHE_DIR": str(compile_cache_dir()),
           "JAX_COMPILATION_CACHE_MAX_SIZE": str(COMPILE_CACHE_BYTES)} if cfg.learner.compile_cache else {}
    env |= cfg.learner.env
    return {"env_vars": env} if env else None


def learner_process_env(cfg: RunConfig, placement, chip_bounds: str | None = None,
                        host_chips: int | None = None) -> list[dict[str, str]]:
    """Each learner process's TPU variables (empty off TPU), over the hosts `placement` gave it and their chips'
    coordinates; learner.env wins. `chip_bounds`, `host_chips`: a one-host learner's settled bounds and its host's
    chips (`settled_chip_bounds`, `tpu_host_chips`)."""
    tpu = cfg.learner.resources.tpu
    hosts = bundle_hosts(placement) if placement is not None else None
    chips = host_chip_coords(placement) if placement is not None and tpu else None
    envs = learner_envs(cfg.learner.topology, cfg.learner.hosts, tpu, hosts, chips, host_chips, chip_bounds)
    return [env | cfg.learner.env for env in envs]


def engine_replica_env(cfg: RunConfig, chip_bounds: str | None = None,
                       host_chips: int | None = None) -> list[dict[str, str]]:
    """Each engine replica's TPU variables (empty off TPU); its server actor and so its engine process get them.
    The generation (whose hosts' size decides what is a whole host) is the learner's: a run is on one kind of TPU."""
    return engine_envs(cfg.rollout.replicas, cfg.rollout.resources.tpu, cfg.learner.hosts,
                       generation_of(cfg.learner.topology), host_chips, chip_bounds)


def tpu_host_chips() -> int | None:
    """The chips of this cluster's TPU hosts (Ray's `TPU` resource of its nodes), None without TPU nodes."""
    sizes = {int(n["Resources"].get("TPU", 0)) for n in ray.nodes() if n.get("Alive")} - {0}
    return max(sizes) if sizes else None


_SETTLED: dict[tuple, str | None] = {}
"""(generation, chips, host chips) -> the chip bounds whose first psum worked, once per driver."""


def settled_chip_bounds(cfg: RunConfig, chips: float, options: dict, env: dict[str, str]) -> str | None:
    """The chip bounds for a process on `chips` of a TPU host of this cluster (orchestration/cluster/tpu_settle.py):
    None off TPU, when there is one setting only, or when `env` (learner.env / rollout.backend.env) sets them."""
    host = tpu_host_chips()
    if not chips or host is None or "TPU_CHIPS_PER_PROCESS_BOUNDS" in env:
        return None
    key = (generation_of(cfg.learner.topology), int(chips), host)
    if key not in _SETTLED:
        _SETTLED[key] = settle_chip_bounds(*key, options)
    return _SETTLED[key]


def connect(cfg: RunConfig, verbose: bool = True) -> bool:
    """Join the configured cluster, the `ray job submit` cluster (RAY_ADDRESS), or start a private local one.
    Not `verbose`: the workers' output stays in Ray's session logs, Ray's own lines go to the driver's log file
    (orchestration/console.py).

    Returns True when this process started the cluster (and so should shut it down).
    """
    options = ray_init_options(verbose)
    ray_cfg: RayConfig = cfg.ray
    address = ray_cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **options)
        log.info("joined Ray cluster at %s", address)
        return False
    # address="local" always starts a new cluster: a bare ray.init() would silently attach to any cluster already
    # running on this machine without shipping our code to it.
    needed = cfg.rollout.resources.num_cpus * cfg.rollout.replicas + cfg.learner.resources.num_cpus * cfg.learner.hosts
    if cfg.judge_engine is not None:
        needed += cfg.judge_engine.resources.num_cpus
    num_cpus = ray_cfg.num_cpus or max(int(needed) + 1, os.cpu_count() or 1)
    start_local_ray(num_cpus, **options)
    log.info("started a local Ray cluster (%d logical CPUs)", num_cpus)
    return True


def alive_nodes() -> int:
    """How many nodes of the connected cluster are alive."""
    return len([n for n in ray.nodes() if n.get("Alive")])


def driver_address() -> str:
    """This process's node address, as the other nodes see it."""
    return ray.util.get_node_ip_address()


def disconnect() -> None:
    """Leave the cluster (stopping it if this process started it)."""
    ray.shutdown()


def start_learner(cfg: RunConfig, checkpoint_dir: str):
    """The learner's handle (one actor, or with learner.hosts > 1 a group of processes behind it); its model loads
    in the background while the rollout server starts."""
    from learner.handle import LearnerHandle

    check_cluster_fits(cfg)  # the first actor: a run the cluster cannot hold fails in seconds, not waits forever
    placement = reserve_learner(cfg)
    options = cfg.learner.resources.ray_options()
    if runtime_env := learner_runtime_env(cfg):
        options["runtime_env"] = runtime_env
    bounds = settled_chip_bounds(cfg, cfg.learner.resources.tpu, cfg.learner.resources.ray_options(),
                                 cfg.learner.env) if cfg.learner.hosts == 1 else None
    process_env = learner_process_env(cfg, placement, bounds, tpu_host_chips())
    return LearnerHandle.start(part_config(cfg.learner, LearnerConfig), cfg.model.resolved_path, checkpoint_dir,
                               options, placement=placement, process_env=process_env)


def start_rollout(cfg: RunConfig):
    """The rollout server behind its Ray actor (or rollout.replicas of them behind one fleet handle); blocks until
    every engine answers /health."""
    from rollout.fleet import setup_rollout

    # Before the engines' chips are reserved: a probe of the bounds needs them (one share of the learner's size was
    # settled already, with the learner's own chips).
    bounds = settled_chip_bounds(cfg, cfg.rollout.resources.tpu, cfg.rollout.resources.ray_options(),
                                 cfg.rollout.backend.env)
    placement = reserve_engines(cfg)
    replica_env = engine_replica_env(cfg, bounds, tpu_host_chips())
    rollout = setup_rollout(part_config(cfg.rollout, RolloutConfig), cfg.model.resolved_path, placement,
                            cfg.rollout.resources.ray_options(), replica_env=replica_env)
    base_url = rollout.start()
    log.info("rollout server (%s, %d replica(s)) ready at %s", cfg.rollout.backend.kind, cfg.rollout.replicas,
             base_url)
    return rollout
