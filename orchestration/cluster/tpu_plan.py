"""What each TPU process of a run will start with, shown before anything starts (`preflight` prints it).

The driver computes these variables when it places the processes (orchestration/cluster/launch.py); here the same
functions run on the config alone. A learner on several hosts is shown as libtpu lays its `learner.topology` name out
(hosts numbered x fastest) on placeholder hosts HOST0, HOST1, ...: on a slice the placed hosts' own chip
coordinates decide its grid and task order (orchestration/cluster/tpu_layout.py), so compare these lines with what
`aha tpu-check` reads on the slice. Where Ray's table reads the name the other way round (a 2-D name that is not
square), a note says what Ray's sub-slice of that name gives instead.
"""

from __future__ import annotations

from orchestration.cluster.tpu_env import Topology, engine_envs, generation_of, learner_envs
from orchestration.cluster.tpu_layout import RAY_WORKER_DIMS_2D, RAY_WORKER_DIMS_3D, ray_worker_coords

KEYS = ("TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "CLOUD_TPU_TASK_ID", "TPU_PROCESS_PORT",
        "TPU_PROCESS_ADDRESSES", "TPU_RUNTIME_METRICS_PORTS", "TPU_TOPOLOGY", "TPU_ACCELERATOR_TYPE")
"""The variables shown (the older TPU_HOST_BOUNDS / TPU_CHIPS_PER_HOST_BOUNDS names always equal the first two;
TPU_TOPOLOGY and TPU_ACCELERATOR_TYPE stand for the GKE plugin's variables, set with TPU_SKIP_MDS_QUERY and the
worker list on a slice's hosts, orchestration/cluster/tpu_gke.py). A half host shows the first chip bounds the run
tries (it keeps the first whose psum works, orchestration/cluster/tpu_settle.py)."""


def planned_envs(cfg) -> list[tuple[str, dict[str, str]]]:
    """(process, its TPU variables) for every learner process and engine replica; [] when nothing runs on TPU."""
    learner, rollout = cfg.learner, cfg.rollout
    out: list[tuple[str, dict[str, str]]] = []
    if learner.resources.tpu:
        hosts = Topology.parse(learner.topology).named_hosts() if learner.hosts > 1 else None
        ips = [f"HOST{i}" for i in range(learner.hosts)]
        envs = learner_envs(learner.topology, learner.hosts, learner.resources.tpu, ips, hosts)
        out += [(f"learner process {i}", env | learner.env) for i, env in enumerate(envs)]
    if rollout.resources.tpu:
        envs = engine_envs(rollout.replicas, rollout.resources.tpu, learner.hosts, generation_of(learner.topology))
        out += [(f"engine replica {i}", env | rollout.backend.env) for i, env in enumerate(envs)]
    return out


def describe(cfg) -> list[str]:
    """Preflight's lines: one per TPU process, its variables in KEYS order ("-" where libtpu's own value stays)."""
    planned = planned_envs(cfg)
    if not planned:
        return []
    lines = ["preflight: TPU variables per process (set before it imports JAX; learner.env / rollout.backend.env "
             "win; a multi-host learner as its topology name lays out, on a slice from the hosts' chip coordinates):"]
    for name, env in planned:
        lines.append(f"  {name}: " + " ".join(f"{k}={env.get(k, '-')}" for k in KEYS))
    return lines + _ray_reading(cfg, planned)


def _ray_reading(cfg, planned) -> list[str]:
    """A note when Ray's sub-slice of the learner's topology name holds its hosts in another grid than the name's."""
    learner = cfg.learner
    topology = Topology.parse(learner.topology)
    if learner.hosts == 1 or not learner.resources.tpu or topology is None or \
            topology.shape not in {**RAY_WORKER_DIMS_2D, **RAY_WORKER_DIMS_3D}:
        return []
    hosts = [ray_worker_coords(w, topology.shape) for w in range(learner.hosts)]
    env = learner_envs("cpu", learner.hosts, learner.resources.tpu, ["-"] * learner.hosts, hosts)[0]
    named = planned[0][1]
    if (env["TPU_PROCESS_BOUNDS"], env["TPU_CHIPS_PER_PROCESS_BOUNDS"]) == \
            (named["TPU_PROCESS_BOUNDS"], named["TPU_CHIPS_PER_PROCESS_BOUNDS"]):
        return []
    return [f"  note: Ray 2.60 reads {topology.shape} with its axes the other way round: the hosts of its "
            f"{topology.shape} sub-slice sit as TPU_PROCESS_BOUNDS={env['TPU_PROCESS_BOUNDS']} "
            f"TPU_CHIPS_PER_PROCESS_BOUNDS={env['TPU_CHIPS_PER_PROCESS_BOUNDS']}; the run reads the placed hosts' "
            "chip coordinates and sets what they say"]
