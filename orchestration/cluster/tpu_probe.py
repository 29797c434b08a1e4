"""Small Ray actors that start JAX under a given TPU environment and say what they see (`aha tpu-check`'s rows).

Each probe is a fresh process: its environment (a candidate set of libtpu variables) is in its `runtime_env`, so it
is there before the process imports JAX, as for the learner and the engines. `devices` starts the backend and
reports the devices, their chips' coordinates and the libtpu variables the process ran with; `join` + `psum` join
several probes into one `jax.distributed` runtime and sum one value per device across all of them, the collective
a multi-host learner's step needs. Every call is bounded by the caller's timeout: a libtpu that waits for peers that
never come (the failure this check looks for) must become a row that says so, not a hung command.

Two processes are judged to hold their own chips by what each reports itself: its device count, and Ray's
`TPU_VISIBLE_CHIPS` for it (disjoint between processes on one host). Their chips' coordinates are shown, not compared:
an isolated libtpu may number its own chips from (0, 0, 0), so two halves of a host can report the same coordinates.
A stopped probe is waited for until its process is gone (libtpu holds the chips until it exits), so the next row
never starts on chips still held.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ENV_PREFIXES = ("TPU_", "CLOUD_TPU", "LIBTPU", "JAX_PLATFORMS", "XLA_FLAGS")


@dataclass(frozen=True)
class Row:
    """One line of the check's table."""

    check: str
    setting: str
    result: str
    """"ok", "FAILED", or why it did not run ("not on TPU", "not a multi-host slice")."""
    detail: str = ""
    variables: str = ""
    """The exact variables the row's processes ran with ("K=V ..."; one process's, "|" between processes)."""


@ray.remote(max_restarts=0)
class Probe:
    """A process that reports its JAX devices (and may join others in one jax.distributed runtime)."""

    def address(self) -> str:
        """host:port for jax.distributed's coordinator on this probe's node (a free port)."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"

    def where(self) -> tuple[str, int]:
        """(node id, pid) of this probe's process: where to wait for it to exit."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def join(self, coordinator: str, processes: int, process_id: int) -> None:
        import jax

        jax.distributed.initialize(coordinator, processes, process_id, initialization_timeout=120)

    def devices(self) -> dict:
        """The devices JAX sees here, with their chips' coordinates and this process's TPU variables."""
        import jax

        devices = jax.local_devices()
        metrics = os.environ.get("TPU_RUNTIME_METRICS_PORTS", "").split(",")[0]
        return {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices),
                "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "visible": os.environ.get("TPU_VISIBLE_CHIPS", ""),
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


_WHERE: dict = {}
"""A started probe's actor id -> its first call, `where` (answered before anything imports JAX, so a probe stuck in
libtpu's start can still be found and waited for)."""


def start_probes(envs: list[dict[str, str]], options: list[dict]) -> list:
    """One probe per (env, Ray options); each env reaches its process before JAX is imported."""
    probes = [Probe.options(**opts, runtime_env={"env_vars": env}).remote() for env, opts in zip(envs, options)]
    for probe in probes:
        _WHERE[probe._actor_id] = probe.where.remote()
    return probes


@ray.remote(num_cpus=0, max_retries=0)
def _wait_exit(pid: int, timeout_s: float) -> bool:
    """On the probe's node: True once process `pid` is gone (False if still there after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def stop(probes: list, timeout_s: float = 60.0) -> None:
    """Kill the probes and wait until each one's process has exited (its chips are free again)."""
    where = []
    for probe in probes:
        try:
            where.append(ray.get(_WHERE.pop(probe._actor_id), timeout=5))
        except (ray.exceptions.RayError, TimeoutError, KeyError):
            where.append(None)  # never started (no process to wait for)
        ray.kill(probe, no_restart=True)
    waits = [_wait_exit.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        pid, timeout_s) for node, pid in filter(None, where)]
    if waits and not all(ray.get(waits, timeout=timeout_s + 30)):
        raise RuntimeError(f"a killed TPU probe's process was still running after {timeout_s:.0f} s: its chips are "
                           "not free; stop it (its pid is in `ps`) and run the check again")


def last_line(err: BaseException) -> str:
    """The last non-empty line of an actor's error (the cause, without Ray's traceback)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__)[:200]


def variables(envs: list[dict[str, str]]) -> str:
    """The TPU variables of each process as one line to copy ("K=V K=V | K=V ...")."""
    return " | ".join(" ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES))
                      for env in envs)


def own_chips(seen: list[dict], want: int) -> str | None:
    """None when every process saw `want` devices of its own; else why not. Own: Ray's TPU_VISIBLE_CHIPS of the
    processes on one host do not overlap and each lists `want` chips (where Ray set it)."""
    for s in seen:
        if s["count"] != want:
            return f"a process saw {s['count']} devices, not {want}"
    by_node: dict[str, list[set]] = {}
    for s in seen:
        if s["visible"]:
            chips = set(s["visible"].split(","))
            if len(chips) != want:
                return f"TPU_VISIBLE_CHIPS={s['visible']} is not {want} chips"
            by_node.setdefault(s["node"], []).append(chips)
    for sets in by_node.values():
        if sum(map(len, sets)) != len(set().union(*sets)):
            return "two processes on one host were given the same chips (TPU_VISIBLE_CHIPS)"
    return None


def devices_row(check: str, setting: str, envs: list[dict[str, str]], options: list[dict], want: int,
                timeout_s: float) -> tuple[Row, list[dict]]:
    """Start a probe per env at once, ask each for its devices; ok when each sees `want` devices of its own chips."""
    probes = start_probes(envs, options)
    try:
        seen = ray.get([p.devices.remote() for p in probes], timeout=timeout_s)
    except (ray.exceptions.RayError, TimeoutError) as err:
        return Row(check, setting, "FAILED", last_line(err), variables(envs)), []
    finally:
        stop(probes)
    why = own_chips(seen, want)
    detail = "; ".join(f"{s['count']} {s['platform']} ({s['kind']}) at {_span(s['coords'])}, chips "
                       f"{s['visible'] or 'all'}, metrics {s['metrics']}" for s in seen)
    return Row(check, setting, "FAILED" if why else "ok", detail + (f"; {why}" if why else ""),
               variables([s["env"] for s in seen])), seen


def psum_row(check: str, setting: str, envs: list[dict[str, str]], options: list[dict],
             timeout_s: float) -> Row:
    """Join one probe per env into one jax.distributed runtime (no join for one probe) and psum; ok when every
    process sums every device."""
    probes = start_probes(envs, options)
    try:
        if len(probes) > 1:
            coordinator = ray.get(probes[0].address.remote(), timeout=timeout_s)
            ray.get([p.join.remote(coordinator, len(probes), i) for i, p in enumerate(probes)], timeout=timeout_s)
        seen = ray.get([p.devices.remote() for p in probes], timeout=timeout_s)
        sums = ray.get([p.psum.remote() for p in probes], timeout=timeout_s)
    except (ray.exceptions.RayError, TimeoutError) as err:
        return Row(check, setting, "FAILED", last_line(err), variables(envs))
    finally:
        stop(probes)
    total = sum(s["count"] for s in seen)
    ok = all(v == total for v in sums)
    return Row(check, setting, "ok" if ok else "FAILED",
               f"psum {sums} over {total} devices in {len(probes)} processes (want {float(total)} each)",
               variables([s["env"] for s in seen]))


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
