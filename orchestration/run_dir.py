"""`RunDir`: where a run writes (a local folder or shared storage such as `gs://bucket/runs/x`) and the driver's
working copy of its own files.

The parts write straight to the run dir, wherever they run: the learner its Orbax checkpoints and the final adapter
(learner/, through common/storage.py). The driver's own files (config.yaml, metrics.jsonl, samples.jsonl, train.log,
summary.json, plots, TensorBoard and wandb folders) are written to a local folder first, as the libraries writing
them need (appends, event files), and copied to the URI as they change: metrics and samples after every row, the
rest at the end. The files that only grow (`APPENDED`) send only their new bytes (`common.storage.append`, a GCS
compose): copying metrics.jsonl and samples.jsonl whole after every row sent the square of the run's length
(bench/bench_run_storage.py, docs/benchmarks.md). A file rewritten in place (a resume drops the rows after its
checkpoint) no longer starts with what was sent, and goes up whole once. On a local run dir the two are one folder
and nothing is copied.

A local run dir on a Ray cluster of several nodes is refused (`check_shared`): the learner may run on another host
and write its checkpoints where the driver (and a resumed learner elsewhere) cannot read them.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common.storage import absolute, append, download, exists, is_uri, join, list_names, upload, write_bytes

log = logging.getLogger(__name__)

DRIVER_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "train.log", "saved.json", "summary.json", "plots",
                "tb", "wandb")
RESUMED_FILES = ("metrics.jsonl", "samples.jsonl", "train.log", "saved.json")  # what a resumed driver appends to
APPENDED = ("metrics.jsonl", "samples.jsonl", "train.log")
"""Driver files that only grow while a run writes them: their copies on the URI are appended to."""
CHECKPOINTS = "checkpoints"
TAIL_BYTES = 256
"""How much of a file's last sent bytes is kept to recognise that the file still starts with what was sent."""


@dataclass(frozen=True)
class Sent:
    """What the URI holds of one appended file: its first `size` bytes, ending in `tail`."""

    size: int
    tail: bytes

    @classmethod
    def of(cls, data: bytes) -> Sent:
        return cls(len(data), data[-TAIL_BYTES:])

    def prefix_of(self, path: Path) -> bool:
        """Whether the file at `path` still starts with the bytes sent (it has only grown since)."""
        with path.open("rb") as f:
            f.seek(max(0, self.size - len(self.tail)))
            return f.read(len(self.tail)) == self.tail and path.stat().st_size >= self.size


class RunDirError(RuntimeError):
    """The run directory cannot serve this run (a local path on several hosts, a resume that cannot see its
    checkpoint); the message is one line that says what to change."""


class RunDir:
    """A run's directory: `uri` (local path or URI), `local` (the driver's copy), `path()` for what parts write."""

    def __init__(self, uri: str | Path):
        self.uri = absolute(uri)
        self.remote = is_uri(self.uri)
        self.local = Path(tempfile.mkdtemp(prefix="aha-run-")) if self.remote else Path(self.uri)
        self.local.mkdir(parents=True, exist_ok=True)
        self._sent: dict[str, Sent] = {}  # appended files: what the URI already holds of each

    def __str__(self) -> str:
        return self.uri

    def path(self, *names: str) -> str:
        """`uri/names...`: where a part on any host writes (checkpoints, the adapter)."""
        return join(self.uri, *names)

    def sync(self, *names: str) -> None:
        """Copy the driver's files `names` (files or folders under `local`) to the URI; no-op for a local run dir."""
        if not self.remote:
            return
        for name in names:
            path = self.local / name
            if name in APPENDED and path.is_file():
                self._sync_appended(name, path)
            elif path.exists():
                upload(path, self.path(name))

    def _sync_appended(self, name: str, path: Path) -> None:
        """Send the bytes added since the last sync, or the whole file when it no longer starts with what was sent."""
        sent = self._sent.get(name)
        if sent is not None and sent.prefix_of(path):
            with path.open("rb") as f:
                f.seek(sent.size)
                new = f.read()
            append(self.path(name), new)
            self._sent[name] = Sent(sent.size + len(new), (sent.tail + new)[-TAIL_BYTES:])
        else:
            data = path.read_bytes()
            write_bytes(self.path(name), data)
            self._sent[name] = Sent.of(data)

    def sync_all(self) -> None:
        """Copy every driver file to the URI (end of a run, or a run that stopped)."""
        self.sync(*DRIVER_FILES)

    def pull(self) -> None:
        """Fetch the driver files a resumed run appends to (metrics, samples, its log) from the URI."""
        if self.remote:
            for name in RESUMED_FILES:
                if download(self.path(name), self.local / name) and name in APPENDED:
                    self._sent[name] = Sent.of((self.local / name).read_bytes())

    def note_saved(self, step: int) -> None:
        """Record that checkpoint `step` is saved: a resume whose learner cannot find it is then an error."""
        (self.local / "saved.json").write_text(json.dumps({"step": step, "checkpoints": self.path(CHECKPOINTS)}))
        self.sync("saved.json")

    def expected_checkpoint(self) -> int | None:
        """The newest checkpoint this run saved, by the driver's record or by what the driver sees; None if none."""
        steps = []
        if (self.local / "saved.json").exists():
            steps.append(int(json.loads((self.local / "saved.json").read_text())["step"]))
        for name in list_names(self.path(CHECKPOINTS)):
            # A checkpoint on storage is complete once Orbax wrote its commit file (locally: once renamed).
            if name.isdigit() and (not self.remote or exists(self.path(CHECKPOINTS, name, "commit_success.txt"))):
                steps.append(int(name))
        return max(steps) if steps else None


def local_copy(run: str) -> Path:
    """A local folder with a run's config.yaml and final adapter: the run dir itself, or, for a run on shared
    storage, a fresh copy of those (what `orchestration.cli.serve` starts an engine from)."""
    if not is_uri(run):
        return Path(run)
    local = Path(tempfile.mkdtemp(prefix="aha-run-"))
    for name in ("config.yaml", "summary.json", "adapter"):
        download(join(run, name), local / name)
    return local


def check_shared(run_dir: RunDir, shared: bool, nodes: int) -> None:
    """Refuse a local run dir on a cluster of several nodes unless the config says every node mounts it."""
    if nodes > 1 and not run_dir.remote and not shared:
        raise RunDirError(f"run dir {run_dir} is a local path, but this Ray cluster has {nodes} nodes and the learner "
                          "may write its checkpoints on another host; use storage every host reads (--run-dir "
                          "gs://bucket/path) or, if that path is a shared mount on every node, set "
                          "train.run_dir_shared: true")
