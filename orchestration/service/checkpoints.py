"""The records of the training runs and their checkpoints on the run directory: what the SDK's RestClient lists,
inspects, publishes, expires and deletes.

Each training client has `<root>/tinker/<model_id>/run.json` (its TrainingRun: base model, LoRA, user_metadata) and
`checkpoints.jsonl`, one line per event on one of its checkpoints: a save (the SDK's `Checkpoint` fields: id, type,
tinker path, time, size, public, user_metadata, expires_at), the whole row again after a change of its public flag
or expiry, or `{"checkpoint_id", "deleted": true}`. A checkpoint is its last line. Lines are only appended, so a
gs:// record costs one small composed write per event and any later server reads the same history (rows of older
servers, with fewer fields, read with the defaults). A checkpoint past its `expires_at` is deleted, its folder and
then its record, by the next look at its run or by the service's periodic `sweep`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from common.storage import append_text, exists, file_sizes, is_uri, join, list_names, read_text, remove, write_text
from orchestration.service import paths
from orchestration.service.futures import UserError

log = logging.getLogger(__name__)
TYPES = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
MAX_TTL_S = 10 * 365 * 24 * 3600  # the SDK's documented upper bound: 10 years


@dataclass(frozen=True)
class SaveOptions:
    """What a save request asks of its checkpoint besides its name."""

    ttl_seconds: int | None = None
    user_metadata: dict[str, str] | None = None
    overwrite: bool = True  # only save_weights has the field (False by default); the other saves replace

    @classmethod
    def of(cls, body: dict[str, Any], records: "CheckpointRecords") -> "SaveOptions":
        """The body's fields, the TTL checked before the save is queued."""
        ttl = body.get("ttl_seconds")
        records.check_ttl(ttl)
        metadata = body.get("user_metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise UserError(f"user_metadata {metadata!r}: give a mapping of strings to strings")
        overwrite = bool(body["overwrite"]) if "overwrite" in body else True
        return cls(None if ttl is None else int(ttl), metadata, overwrite)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class CheckpointRecords:
    """run.json and checkpoints.jsonl of every training client under `root`; safe to call from several threads."""

    def __init__(self, root: str, min_ttl_s: int):
        self.root, self.min_ttl_s = root, min_ttl_s
        self._lock = threading.RLock()  # one record change at a time: a read-then-append must not interleave

    # ---- training runs ------------------------------------------------------------------------------------------
    def write_run(self, model_id: str, record: dict[str, Any]) -> None:
        with self._lock:
            path = paths.join_run(self.root, model_id, "run.json")
            if exists(path):  # a client loaded again keeps the time it was created
                record = {"created_at": json.loads(read_text(path)).get("created_at"), **record}
            text = json.dumps({"created_at": now().isoformat(), **record})
            if is_uri(path):  # an object is replaced whole
                write_text(path, text)
            else:  # a file is renamed into place, so a listing never reads it half written
                write_text(f"{path}.tmp", text)
                os.replace(f"{path}.tmp", path)

    def run_ids(self) -> list[str]:
        """Every training client with a record, oldest first."""
        ids = [name for name in list_names(join(self.root, "tinker"))
               if exists(paths.join_run(self.root, name, "run.json"))]
        return sorted(ids, key=lambda i: self._run_record(i).get("created_at") or "")

    def _run_record(self, model_id: str) -> dict[str, Any]:
        path = paths.join_run(self.root, model_id, "run.json")
        if not exists(path):
            raise KeyError(f"training run {model_id}")
        return json.loads(read_text(path))

    def training_run(self, model_id: str, last_request_time: str | None = None) -> dict[str, Any]:
        """What `GET training_runs/{id}` answers: the run's record and its newest checkpoint of each kind."""
        record = self._run_record(model_id)
        rows = self.checkpoints(model_id)
        last = lambda kind: next((c for c in reversed(rows) if c["checkpoint_type"] == kind), None)  # noqa: E731
        return {**record, "last_checkpoint": last("training"), "last_sampler_checkpoint": last("sampler"),
                "last_request_time": last_request_time or record.get("created_at") or now().isoformat()}

    # ---- checkpoints --------------------------------------------------------------------------------------------
    def checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        """The run's live checkpoints, oldest first; expired ones deleted on the way."""
        if not exists(paths.join_run(self.root, model_id, "run.json")):
            raise KeyError(f"training run {model_id}")
        with self._lock:
            rows = self._rows(model_id)
            for row in [r for r in rows.values() if expired(r)]:
                self._delete(row)
                del rows[row["checkpoint_id"]]
        return list(rows.values())

    def all_checkpoints(self) -> list[dict[str, Any]]:
        """Every run's live checkpoints, newest first."""
        rows = [row for model_id in self.run_ids() for row in self.checkpoints(model_id)]
        return sorted(rows, key=lambda r: r["time"], reverse=True)

    def checkpoint(self, path: paths.TinkerPath) -> dict[str, Any]:
        """The live record of `path`; KeyError (a 404) when there is none."""
        row = next((r for r in self.checkpoints(path.model_id) if r["checkpoint_id"] == path.checkpoint_id), None)
        if row is None:
            raise KeyError(str(path))
        return row

    def is_saved(self, path: paths.TinkerPath) -> bool:
        try:
            self.checkpoint(path)
            return True
        except KeyError:
            return False

    def note(self, path: paths.TinkerPath, ttl_seconds: int | None = None,
             user_metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """Record a save just written to `path`'s folder (a name saved again: this save replaces the record)."""
        at = now()
        row = {"checkpoint_id": path.checkpoint_id, "checkpoint_type": TYPES[path.kind], "tinker_path": str(path),
               "time": at.isoformat(), "size_bytes": sum(file_sizes(path.location(self.root)).values()),
               "public": False, "user_metadata": user_metadata, "expires_at": expiry(at, ttl_seconds)}
        with self._lock:
            self._append(path.model_id, row)
        return row

    def delete(self, path: paths.TinkerPath) -> None:
        with self._lock:
            self._delete(self.checkpoint(path))

    def set_public(self, path: paths.TinkerPath, public: bool) -> None:
        with self._lock:
            row = self.checkpoint(path)
            if row.get("public", False) == public:  # the SDK documents a 409, which its own client retries for
                raise UserError(f"{path} is already {'public' if public else 'private'}")  # minutes: a 400
            self._append(path.model_id, {**row, "public": public})

    def set_ttl(self, path: paths.TinkerPath, ttl_seconds: int | None) -> None:
        """Expire `path` `ttl_seconds` from now (None: never)."""
        self.check_ttl(ttl_seconds)
        with self._lock:
            self._append(path.model_id, {**self.checkpoint(path), "expires_at": expiry(now(), ttl_seconds)})

    def check_ttl(self, ttl_seconds: int | None) -> None:
        if ttl_seconds is not None and not self.min_ttl_s <= int(ttl_seconds) <= MAX_TTL_S:
            raise UserError(f"ttl_seconds {ttl_seconds}: give {self.min_ttl_s} (api.min_checkpoint_ttl_s of the "
                            f"server's config) to {MAX_TTL_S} (10 years), or None for no expiry")

    def sweep(self) -> int:
        """Delete every expired checkpoint of every run; how many went."""
        gone = 0
        for model_id in self.run_ids():
            with self._lock:
                for row in [r for r in self._rows(model_id).values() if expired(r)]:
                    self._delete(row)
                    gone += 1
        return gone

    # ---- the log ------------------------------------------------------------------------------------------------
    def _rows(self, model_id: str) -> dict[str, dict[str, Any]]:
        index = paths.join_run(self.root, model_id, "checkpoints.jsonl")
        rows: dict[str, dict[str, Any]] = {}
        for line in (read_text(index) if exists(index) else "").split("\n")[:-1]:  # a line being written has no \n yet
            row = json.loads(line)
            rows.pop(row["checkpoint_id"], None)
            if not row.get("deleted"):
                rows[row["checkpoint_id"]] = {"public": False, "user_metadata": None, "expires_at": None,
                                              "size_bytes": None, **row}
        return dict(sorted(rows.items(), key=lambda item: item[1]["time"]))  # in save order (a change keeps it)

    def _append(self, model_id: str, row: dict[str, Any]) -> None:
        append_text(paths.join_run(self.root, model_id, "checkpoints.jsonl"), json.dumps(row) + "\n")

    def _delete(self, row: dict[str, Any]) -> None:
        """The folder first, then the record: a crash in between leaves a record whose load fails, never files
        no record names."""
        path = paths.parse(row["tinker_path"], tuple(TYPES))
        remove(path.location(self.root))
        self._append(path.model_id, {"checkpoint_id": row["checkpoint_id"], "deleted": True, "time": now().isoformat()})
        log.info("checkpoint %s deleted%s", path, " (expired)" if expired(row) else "")


def expiry(at: dt.datetime, ttl_seconds: int | None) -> str | None:
    return None if ttl_seconds is None else (at + dt.timedelta(seconds=int(ttl_seconds))).isoformat()


def expired(row: dict[str, Any]) -> bool:
    return row.get("expires_at") is not None and dt.datetime.fromisoformat(row["expires_at"]) <= now()
