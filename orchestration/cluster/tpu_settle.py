"""Which chip bounds a process on part of a TPU host starts with: the first setting whose psum works on the chips.

Half of an 8-chip v5e or v6e host has two candidate bounds (orchestration/cluster/tpu_env.py `SHARE_RULES`, each
with its source) and no upstream table that settles it for every libtpu. Rather than fail a first run on the wrong
one, the driver asks the chips before it starts the learner: a probe process holding the learner's share of a host
(the same Ray resources, the same variables) sums one value per device (`tpu_probe.psum_row`); the first setting
that sums right is used for the learner and for every engine holding a share of the same size, and the run's log
says which one worked and what failed before it. `aha tpu-check` tries the same settings in the same order.
A process holding a whole host, or one chip or two, has one setting only and starts without asking.
"""

from __future__ import annotations

import logging

from orchestration.cluster.tpu_env import BASE_PORT, NO_CHIP_BOUNDS, isolated_env, share_settings

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 300.0
"""Per setting: a libtpu that waits for chips it cannot have fails the setting instead of hanging the run."""


def settle_chip_bounds(generation: str | None, chips: int, host_chips: int | None, options: dict,
                       timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The chip bounds for a process on `chips` of a host of `host_chips`: None when there is nothing to choose,
    else the first of tpu_env's settings (then Ray's chips alone) whose one-process psum works, with Ray `options`
    (the learner's resources). Raises with every setting's failure when none works."""
    settings = share_settings(generation, chips, host_chips)
    if len(settings) < 2:
        return None
    from orchestration.cluster.tpu_probe import psum_row

    tried = []
    for bounds in [*settings, NO_CHIP_BOUNDS]:
        env = isolated_env(chips, BASE_PORT, generation, host_chips, bounds)
        row = psum_row("first psum", bounds or "chips only", [env], [options], timeout_s)
        if row.result == "ok":
            log.info("TPU chip bounds for a process on %d of a host's %s chips: %s (its first psum worked: %s%s)",
                     chips, host_chips or "8", bounds or "none (Ray's TPU_VISIBLE_CHIPS alone)", row.detail,
                     "; failed before it: " + "; ".join(tried) if tried else "")
            return bounds
        tried.append(f"{bounds or 'chips only'}: {row.detail}")
        log.warning("TPU chip bounds %s failed their first psum (%s); trying the next", bounds or "none",
                    row.detail)
    raise RuntimeError(f"no chip bounds worked for a process on {chips} TPU chips ({'; '.join(tried)}): run "
                       "`aha tpu-check` on this host and set the variables it prints in learner.env / "
                       "rollout.backend.env")
