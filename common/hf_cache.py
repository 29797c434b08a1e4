"""The prepared models as an offline Hugging Face cache too, so `AutoTokenizer.from_pretrained(HF_ID)` works with
`HF_HUB_OFFLINE=1` on any machine that ran setup.

A Tinker client loads a served model's tokenizer itself, by the name the server gives (the SDK's `get_tokenizer()`
calls `AutoTokenizer.from_pretrained(tokenizer_id)` on the client). The server serves a model by its Hugging Face id,
so that name must resolve where the client runs, without the network: setup lays each prepared model out in the
Hub's cache layout under `$AHA_CACHE/hf/hub` (`models--ORG--NAME/refs/main` naming a snapshot,
`snapshots/<rev>/<file>` linking to the model folder's files), and a client points HF_HUB_CACHE (or HF_HOME, one
level up) at it. A model folder says its id in `hf_id.txt` (written by the same setup); a folder that is itself a
snapshot of a Hub cache is named by its path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from common.model_cache import cache_dir

ID_FILE = "hf_id.txt"
HUB = Path("hf") / "hub"  # under $AHA_CACHE, beside models/
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def hub_dir() -> Path:
    """The Hub cache setup lays out: what a client's HF_HUB_CACHE points at (HF_HOME at its parent)."""
    return cache_dir() / HUB


def checked_id(hf_id: str) -> str:
    if not _ID.match(hf_id) or ".." in hf_id:
        raise ValueError(f"Hugging Face id {hf_id!r}: use ORG/NAME (letters, digits, '_', '.', '-')")
    return hf_id


def hf_id_of(folder: Path) -> str | None:
    """The Hugging Face id a model folder says it is: its hf_id.txt, or its place in a Hub cache
    (`.../models--ORG--NAME/snapshots/<rev>`); None if neither."""
    written = folder / ID_FILE
    if written.is_file():
        return checked_id(written.read_text().strip())
    repo = folder.resolve().parent.parent.name if folder.resolve().parent.name == "snapshots" else ""
    if repo.startswith("models--") and repo.count("--") >= 2:
        return checked_id(repo.removeprefix("models--").replace("--", "/", 1))
    return None


def lay_out(folder: Path, hf_id: str, hub: Path | None = None) -> Path:
    """`folder` as the Hub cache's snapshot of `hf_id` (every file a link into `folder`), and its id in
    `folder/hf_id.txt`; idempotent, and safe beside another setup doing the same. Returns the snapshot."""
    hub = hub or hub_dir()
    checked_id(hf_id)
    folder = folder.resolve()
    id_file = folder / ID_FILE
    if not id_file.is_file() or id_file.read_text().strip() != hf_id:
        _write_atomically(id_file, hf_id + "\n")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.name != ID_FILE)
    # A revision named by the files it holds (names, sizes, times): a remade model is a new snapshot.
    rev = hashlib.sha1("".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns};" for p in files).encode())
    repo = hub / ("models--" + hf_id.replace("/", "--"))
    snapshot = repo / "snapshots" / rev.hexdigest()
    if not snapshot.is_dir():
        building = snapshot.with_name(f".{snapshot.name}.{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(parents=True)
        for p in files:  # relative links: the cache moves with $AHA_CACHE
            (building / p.name).symlink_to(os.path.relpath(p, snapshot))
        try:
            building.rename(snapshot)
        except OSError:  # another setup made it first
            shutil.rmtree(building, ignore_errors=True)
    ref = repo / "refs" / "main"
    if not ref.is_file() or ref.read_text() != snapshot.name:
        ref.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(ref, snapshot.name)
    return snapshot


def _write_atomically(path: Path, text: str) -> None:
    """A reader sees the old text or the new one, never a half-written file."""
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(text)
    part.replace(path)
