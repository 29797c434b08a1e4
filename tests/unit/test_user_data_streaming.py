"""A data file much larger than what the reader keeps trains without being read into memory.

Each format is read by a fresh process that draws shuffled prompts from a ~150 MB file and reports its private
memory (RssAnon: heap and anonymous mappings, what a file read into Python objects or Arrow buffers would fill;
pages of a memory-mapped file are the kernel's cache, not the process's) before opening the file and at its peak.
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROWS = 20_000
FILLER = 8000  # characters a row: 20k rows make a ~150 MB file
# Growth allowed while reading: a reader that kept the rows would grow by about the file's 150 MB. Reading a JSONL
# epoch grew private memory by 17 to 33 MB on one 2-core box (the allocator's free lists and arenas: the same
# commit measured both), so a 16 MB bound failed there by chance; 40 MB is still far below a kept file.
BOUND_MB = 40
"""What the reader may keep (the offset index, one batch of prompts, the Parquet row-group cache) is below this.
Measured 2026-11-26 (this test, quiet box): JSONL 4.5 MB, Parquet 9.5 MB, saved folder 6.6 MB over a 153 MB file."""

PROBE = """
import json, sys
import datasets, pyarrow.parquet  # imported before the baseline: their own memory is not the reader's
from tasks import DataConfig, PromptStream, setup_dataset

def anon_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

path, draws = sys.argv[1], int(sys.argv[2])
start = peak = anon_mb()
prompts = setup_dataset(DataConfig(task="dataset", path=path, parquet_cache_mb=4), "train")
stream = PromptStream(prompts, batch_size=32, seed=0)
seen = set()
for _ in range(draws // 32):
    for prompt in stream.next_batch():
        assert len(prompt.reference["filler"]) == %d
        seen.add(prompt.uid)
    peak = max(peak, anon_mb())
print(json.dumps({"start": start, "peak": peak, "rows": len(prompts), "seen": len(seen)}))
""" % FILLER


def rows():
    """Rows with a filler column of random text, which Parquet cannot compress away."""
    for i in range(ROWS):
        noise = base64.b64encode(random.Random(i).randbytes(FILLER * 3 // 4)).decode()
        yield {"prompt": f"Row {i}?", "answer": str(i), "filler": noise[:FILLER]}


@pytest.fixture(scope="module")
def big_files(tmp_path_factory) -> dict[str, Path]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("big")
    jsonl = root / "big.jsonl"
    with jsonl.open("w") as f:
        for row in rows():
            f.write(json.dumps(row) + "\n")
    parquet = root / "big.parquet"
    schema = pa.schema([("prompt", pa.string()), ("answer", pa.string()), ("filler", pa.string())])
    with pq.ParquetWriter(parquet, schema) as writer:  # written a row group at a time, never whole in memory
        batch = []
        for row in rows():
            batch.append(row)
            if len(batch) == 400:
                writer.write_table(pa.Table.from_pylist(batch, schema))
                batch = []
    saved = root / "saved"
    datasets.Dataset.from_parquet(str(parquet), cache_dir=str(root / "cache")).save_to_disk(str(saved))
    return {"jsonl": jsonl, "parquet": parquet, "saved": saved}


@pytest.mark.parametrize("kind, draws", [("jsonl", ROWS), ("parquet", 640), ("saved", ROWS)])
def test_a_file_much_larger_than_what_is_kept_is_streamed(big_files, kind, draws) -> None:
    """JSONL and the saved folder: a whole epoch. Parquet: 640 random rows, which decode every one of its 40 row
    groups many times over (a shuffled row outside the cache costs its row group: the docstring of
    data.parquet_cache_mb says so)."""
    path = big_files[kind]
    size_mb = sum(p.stat().st_size for p in ([path] if path.is_file() else path.glob("*.arrow"))) / 2**20
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(draws)], cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    grew = report["peak"] - report["start"]
    print(f"{kind}: private memory grew {grew:.1f} MB reading {min(draws, ROWS)} rows of a {size_mb:.0f} MB file")
    assert report["rows"] == ROWS and report["seen"] == min(draws, ROWS)
    assert size_mb > 3 * BOUND_MB, f"the {kind} file ({size_mb:.0f} MB) must be much larger than the bound"
    assert grew < BOUND_MB, (f"{kind}: private memory grew {grew:.0f} MB while reading a {size_mb:.0f} MB file: "
                             "the reader keeps rows it should drop (or read the file whole)")
