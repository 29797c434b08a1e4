"""Reserve one Ray placement bundle per host for a part that spans hosts: learner processes or engine replicas.

Placement is the driver's decision, so it lives here rather than in the parts: `learner.group` and `rollout.fleet`
receive a ready placement group (or None) and only put their actors on its bundles. With accelerators each bundle
is one host's share (CPUs + `TPU` chips or GPUs) and the group is STRICT_SPREAD, i.e. distinct hosts; on CPU there is
nothing to spread (the actors are local processes) and no group is made.
"""

from __future__ import annotations

import ray
from ray.util.placement_group import placement_group

PLACEMENT_TIMEOUT_S = 600


def reserve_hosts(resources, count: int, section: str, key: str):
    """A ready STRICT_SPREAD group of `count` bundles of `resources` (the section's ActorResources), or None on CPU.

    `section`/`key` name the config keys in the error (e.g. "learner", "hosts"), raised when the cluster has no
    `count` distinct nodes with that much after PLACEMENT_TIMEOUT_S.
    """
    r = resources
    if count == 1 or not (r.tpu or r.num_gpus):
        return None
    bundle = {"CPU": r.num_cpus, **({"TPU": r.tpu} if r.tpu else {}), **({"GPU": r.num_gpus} if r.num_gpus else {}),
              **r.custom}
    pg = placement_group([dict(bundle) for _ in range(count)], strategy="STRICT_SPREAD", name=f"aha-{section}")
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"{section}.{key}={count} needs {count} distinct Ray nodes each with {bundle}, not found in "
                           f"{PLACEMENT_TIMEOUT_S} s (cluster: {ray.cluster_resources()}); start Ray on every {section} "
                           f"host or lower {section}.{key} / {section}.resources") from None
    return pg
