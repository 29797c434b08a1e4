"""Bytes a run on gs:// sends for its metrics and samples: whole-file copies after every row against appends.

A training run writes one row to metrics.jsonl and one to samples.jsonl per step, and `RunDir.sync` copies each to
the run's URI right after. Main at 85b20f9 uploaded the whole file every time (the bytes sent grow with the square of
the steps); `RunDir.sync` now sends only the new bytes and composes them onto the object server-side. This runs
ROWS rows of each file through the GCS emulator the suite uses (fake-gcs-server, tests/integration/multinode.py)
behind a relay that counts the bytes the client puts on the wire (tests/integration/counting_proxy.py), once per
way, and checks that the object in the bucket is the local file byte for byte:

    .venv/bin/python bench/bench_run_storage.py [--rows 30]

Rows are the size a TPU config writes: a metrics row of 60 figures and a samples row with 16 completions of about
800 characters (rollout.sampling.n: 16 in configs/*tpu*.yaml).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import storage  # noqa: E402
from orchestration.run_dir import RunDir  # noqa: E402
from tests.integration.counting_proxy import CountingProxy  # noqa: E402
from tests.integration.multinode import make_bucket, start_gcs_emulator  # noqa: E402

FILES = ("metrics.jsonl", "samples.jsonl")


def rows(step: int) -> dict[str, str]:
    """One line of each file for `step`, of realistic size."""
    metrics = {"step": step, **{f"area{k % 6}/figure_{k}": 0.123456789 * (step + k) for k in range(60)}}
    words = " ".join(f"w{(step * 31 + i) % 997}" for i in range(160))
    samples = {"step": step, "prompt": f"Using the numbers [3, 7, 25, {step}], create an equation that equals 100.",
               "completions": [f"<think>{words}</think><answer>{i}</answer>" for i in range(16)],
               "rewards": [0.5] * 16}
    return {"metrics.jsonl": json.dumps(metrics) + "\n", "samples.jsonl": json.dumps(samples) + "\n"}


def whole_file(run: RunDir, name: str) -> None:
    """Main's RunDir.sync for a file: the whole file, uploaded again."""
    storage.upload(run.local / name, run.path(name))


def run_rows(proxy: CountingProxy, run: RunDir, n: int, sync) -> list[int]:
    """Write n rows of each file, syncing after each row as the loop does; the bytes sent for each row."""
    per_row = []
    for step in range(1, n + 1):
        before = proxy.sent
        for name, line in rows(step).items():
            with (run.local / name).open("a") as f:
                f.write(line)
            sync(run, name)
        per_row.append(proxy.sent - before)
    for name in FILES:
        assert storage.read_text(run.path(name)) == (run.local / name).read_text(), f"{name} differs on the bucket"
    return per_row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=30)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="aha-bench-gcs-"))
    emulator, url = start_gcs_emulator("127.0.0.1", workdir)
    try:
        with CountingProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
            os.environ[storage.EMULATOR] = proxy.url
            bucket = make_bucket(url, "aha-bench")
            results = {}
            for way, sync in (("whole file (main)", whole_file), ("appends (RunDir.sync)", RunDir.sync)):
                run = RunDir(storage.join(bucket, "runs", way.split()[0]))
                results[way] = run_rows(proxy, run, args.rows, sync)
            size = sum((run.local / name).stat().st_size for name in FILES)
    finally:
        emulator.kill()
        emulator.wait()
    third = max(1, args.rows // 3)
    print(f"{args.rows} rows of metrics.jsonl + samples.jsonl, {size} bytes in the end, through the GCS emulator")
    print(f"{'way':<24}{'bytes sent':>12}{'x file':>8}{f'rows 1-{third}':>14}{f'last {third} rows':>14}")
    for way, sent in results.items():
        print(f"{way:<24}{sum(sent):>12}{sum(sent) / size:>8.2f}{sum(sent[:third]):>14}{sum(sent[-third:]):>14}")
    whole, appends = (sum(v) for v in results.values())
    print(f"whole-file copies sent {whole / appends:.1f}x the bytes of appends")
    return 0


if __name__ == "__main__":
    sys.exit(main())
