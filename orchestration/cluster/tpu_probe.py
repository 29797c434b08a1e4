"""Small Ray actors that start JAX under a given TPU environment and say what they see (`aha tpu-check`'s rows).

Each probe is a fresh process: its environment (a candidate set of libtpu variables) is in its `runtime_env`, so it
is there before the process imports JAX, as for the learner and the engines. `devices` starts the backend and
reports the devices, their chips' coordinates and the libtpu variables the process ran with; `join` + `psum` join
several probes into one `jax.distributed` runtime and sum one value per device across all of them, the collective
a multi-host learner's step needs. Every call is bounded by the caller's timeout: a libtpu that waits for peers that
never come (the failure this check looks for) must become a row that says so, not a hung command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ray

ENV_PREFIXES = ("TPU_", "CLOUD_TPU", "LIBTPU", "JAX_PLATFORMS", "XLA_FLAGS")


@dataclass(frozen=True)
class Row:
    """One line of the check's table."""

    check: str
    setting: str
    result: str
    """"ok", "FAILED", or why it did not run ("not on TPU", "not a multi-host slice")."""
    detail: str = ""


@ray.remote(max_restarts=0)
class Probe:
    """A process that reports its JAX devices (and may join others in one jax.distributed runtime)."""

    def address(self) -> str:
        """host:port for jax.distributed's coordinator on this probe's node (a free port)."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"

    def join(self, coordinator: str, processes: int, process_id: int) -> None:
        import jax

        jax.distributed.initialize(coordinator, processes, process_id, initialization_timeout=120)

    def devices(self) -> dict:
        """The devices JAX sees here, with their chips' coordinates and this process's TPU variables."""
        import jax

        devices = jax.local_devices()
        metrics = os.environ.get("TPU_RUNTIME_METRICS_PORTS", "").split(",")[0]
        return {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices),
                "coords": sorted({tuple(getattr(d, "coords", ())) for d in devices}),
                "metrics": f"{metrics} {'listening' if _listening(int(metrics)) else 'silent'}" if metrics.isdigit()
                else "default port",
                "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}}

    def psum(self) -> float:
        """One 1.0 per device summed over every device of every joined process (a cross-process all-reduce)."""
        import jax
        import numpy as np
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = jax.make_mesh((jax.device_count(),), ("i",))
        local = np.ones(jax.local_device_count(), np.float32)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("i")), local)
        total = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=mesh, in_specs=PartitionSpec("i"),
                                      out_specs=PartitionSpec("i")))(x)
        return float(np.asarray(total.addressable_data(0))[0])


def start_probes(envs: list[dict[str, str]], options: list[dict]) -> list:
    """One probe per (env, Ray options); each env reaches its process before JAX is imported."""
    return [Probe.options(**opts, runtime_env={"env_vars": env}).remote() for env, opts in zip(envs, options)]


def stop(probes: list) -> None:
    for probe in probes:
        ray.kill(probe, no_restart=True)


def last_line(err: BaseException) -> str:
    """The last non-empty line of an actor's error (the cause, without Ray's traceback)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__)[:200]


def devices_row(check: str, setting: str, envs: list[dict[str, str]], options: list[dict], want: int,
                timeout_s: float) -> tuple[Row, list[dict]]:
    """Start a probe per env at once, ask each for its devices; ok when each sees `want` devices of its own chips."""
    probes = start_probes(envs, options)
    try:
        seen = ray.get([p.devices.remote() for p in probes], timeout=timeout_s)
    except (ray.exceptions.RayError, TimeoutError) as err:
        return Row(check, setting, "FAILED", last_line(err)), []
    finally:
        stop(probes)
    chips = [set(map(tuple, s["coords"])) for s in seen]
    disjoint = sum(len(c) for c in chips) == len(set().union(*chips))
    ok = all(s["count"] == want for s in seen) and disjoint
    detail = "; ".join(f"{s['count']} {s['platform']} ({s['kind']}) at {_span(s['coords'])}, metrics {s['metrics']}"
                       for s in seen)
    return Row(check, setting, "ok" if ok else "FAILED", detail + ("" if disjoint else "; chips overlap")), seen


def psum_row(check: str, setting: str, envs: list[dict[str, str]], options: list[dict],
             timeout_s: float) -> Row:
    """Join one probe per env into one jax.distributed runtime and psum; ok when every process sums every device."""
    probes = start_probes(envs, options)
    try:
        coordinator = ray.get(probes[0].address.remote(), timeout=timeout_s)
        ray.get([p.join.remote(coordinator, len(probes), i) for i, p in enumerate(probes)], timeout=timeout_s)
        seen = ray.get([p.devices.remote() for p in probes], timeout=timeout_s)
        sums = ray.get([p.psum.remote() for p in probes], timeout=timeout_s)
    except (ray.exceptions.RayError, TimeoutError) as err:
        return Row(check, setting, "FAILED", last_line(err))
    finally:
        stop(probes)
    total = sum(s["count"] for s in seen)
    ok = all(v == total for v in sums)
    return Row(check, setting, "ok" if ok else "FAILED",
               f"psum {sums} over {total} devices in {len(probes)} processes (want {float(total)} each)")


def _listening(port: int) -> bool:
    """Whether something on this host accepts connections on `port` (libtpu's runtime-metrics service)."""
    import socket

    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _span(coords: list) -> str:
    """Chip coordinates as per-axis ranges: "x0-1 y0-1 z0"."""
    if not coords or not coords[0]:
        return "no coordinates"
    axes = []
    for a, name in enumerate("xyz"[:len(coords[0])]):
        lo, hi = min(c[a] for c in coords), max(c[a] for c in coords)
        axes.append(f"{name}{lo}" if lo == hi else f"{name}{lo}-{hi}")
    return " ".join(axes)
