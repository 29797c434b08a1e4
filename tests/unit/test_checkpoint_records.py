"""The Tinker service's checkpoint records on a real run directory (a local folder; tests/integration/
test_tinker_service.py drives the same code through the SDK): one append-only log per run, read by a later server,
rows of an older server read with defaults, expired checkpoints deleted with their folders.

Fails on the old main: there was no record of public, user_metadata or expiry, and nothing deleted a checkpoint
(orchestration/service/checkpoints.py did not exist)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestration.service.checkpoints import CheckpointRecords, SaveOptions
from orchestration.service.futures import UserError
from orchestration.service.paths import TinkerPath, join_run

RUN = "s1:train:0"


def saved(root, name: str, kind: str = "weights") -> TinkerPath:
    """A checkpoint folder with one file of 10 bytes, as a save leaves it."""
    path = TinkerPath(RUN, kind, name)
    folder = Path(path.location(str(root)))
    folder.mkdir(parents=True)
    (folder / "data.bin").write_bytes(b"0123456789")
    return path


@pytest.fixture
def records(tmp_path):
    out = CheckpointRecords(str(tmp_path), min_ttl_s=1)
    out.write_run(RUN, {"training_run_id": RUN, "base_model": "m", "lora_rank": 8})
    return out


def test_a_save_is_listed_with_its_fields_and_a_later_server_reads_the_same(records, tmp_path):
    path = saved(tmp_path, "a")
    records.note(path, ttl_seconds=None, user_metadata={"k": "v"})
    [row] = records.checkpoints(RUN)
    assert (row["tinker_path"], row["checkpoint_type"], row["size_bytes"], row["public"], row["user_metadata"],
            row["expires_at"]) == (str(path), "training", 10, False, {"k": "v"}, None)
    assert CheckpointRecords(str(tmp_path), 1).checkpoints(RUN) == [row]


def test_older_rows_read_with_defaults_and_a_name_saved_again_is_its_newest_save(records, tmp_path):
    old = {"checkpoint_id": "weights/a", "tinker_path": f"tinker://{RUN}/weights/a", "time": "2026-01-01T00:00:00+00:00",
           "checkpoint_type": "training"}
    (tmp_path / "tinker" / RUN / "checkpoints.jsonl").write_text(json.dumps(old) + "\n")
    assert records.checkpoints(RUN) == [{**old, "public": False, "user_metadata": None, "expires_at": None,
                                         "size_bytes": None}]
    path = saved(tmp_path, "a")
    records.note(path, user_metadata={"again": "1"})
    [row] = records.checkpoints(RUN)
    assert row["user_metadata"] == {"again": "1"}


def test_publish_delete_and_expiry(records, tmp_path):
    a, b = saved(tmp_path, "a"), saved(tmp_path, "b", "sampler_weights")
    records.note(a)
    records.note(b, ttl_seconds=1)
    records.set_public(a, True)
    with pytest.raises(UserError, match="already public"):
        records.set_public(a, True)
    assert records.checkpoint(a)["public"] is True
    records.delete(a)
    assert not (tmp_path / "tinker" / RUN / "weights" / "a").exists()
    with pytest.raises(KeyError):
        records.delete(a)
    time.sleep(1.1)
    assert records.sweep() == 1 and records.checkpoints(RUN) == []
    assert not (tmp_path / "tinker" / RUN / "sampler_weights" / "b").exists()
    assert json.loads(open(join_run(str(tmp_path), RUN, "checkpoints.jsonl")).readlines()[-1])["deleted"] is True


def test_ttl_bounds_and_save_options(records, tmp_path):
    with pytest.raises(UserError, match=r"ttl_seconds 0: give 1 \(api.min_checkpoint_ttl_s"):
        SaveOptions.of({"ttl_seconds": 0}, records)
    with pytest.raises(UserError, match="10 years"):
        records.check_ttl(10 * 366 * 24 * 3600)
    assert SaveOptions.of({"overwrite": False}, records).overwrite is False
    assert SaveOptions.of({}, records).overwrite is True  # saves without the field replace, as before
    path = saved(tmp_path, "a")
    records.note(path)
    records.set_ttl(path, 3600)
    assert records.checkpoint(path)["expires_at"] is not None
    records.set_ttl(path, None)
    assert records.checkpoint(path)["expires_at"] is None
