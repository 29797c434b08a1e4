"""A run path that may be a URI: a local folder (one host, or a mount every host shares) or `gs://bucket/path`.

Local paths stay plain `pathlib` work. A URI goes through fsspec (gcsfs for `gs://`), and Orbax writes checkpoints
to it through tensorstore, so every host of a slice reads what another wrote. A local GCS emulator is reached as
Google's own clients reach it, through `STORAGE_EMULATOR_HOST` (e.g. `http://10.0.0.1:4443`): `use_emulator()`
points the other two clients at the same endpoint, so a real bucket and a test's emulator take one code path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

EMULATOR = "STORAGE_EMULATOR_HOST"


def is_uri(path: str | os.PathLike) -> bool:
    """Whether `path` names shared storage (`gs://...`, any `scheme://` but `file://`) rather than a local path."""
    text = str(path)
    return "://" in text and not text.startswith("file://")


def absolute(path: str | os.PathLike) -> str:
    """A URI unchanged; a local path made absolute (a relative one means the same to every process of a host)."""
    return str(path).rstrip("/") if is_uri(path) else str(Path(path).expanduser().absolute())


def join(base: str | os.PathLike, *names: str) -> str:
    """`base`/`names`..., for a URI or a local path."""
    if is_uri(base):
        return "/".join([str(base).rstrip("/"), *(n.strip("/") for n in names)])
    return str(Path(base, *names))


def use_emulator() -> None:
    """With $STORAGE_EMULATOR_HOST set, point gcsfs and tensorstore (Orbax's array writer) at it, anonymously.

    gcsfs reads the variable itself but would first look for Google credentials (a metadata-server probe) and, with
    its default zonal-bucket support, probe every bucket over gRPC, which an emulator does not speak (a minute of
    retries per bucket); tensorstore has its own endpoint variable and a test token that skips its credential
    search. Only defaults are set: a value the user exported wins. Call before gcsfs is imported (its switch is read
    at import); every function here calls it.
    """
    url = emulator_url()
    if not url:
        return
    for key, value in (("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false"), ("TENSORSTORE_GCS_HTTP_URL", url),
                       ("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")):
        if os.environ.get(key) in (None, _ours.get(key)):  # ours from an earlier emulator may follow a new one
            os.environ[key] = _ours[key] = value
    import fsspec.config

    # fsspec reads its FSSPEC_* variables once, at import, which Orbax's own imports do before this runs: set the
    # anonymous token in its live config, where every gs:// filesystem (ours, and the one Orbax opens) looks.
    for protocol in ("gs", "gcs"):
        fsspec.config.conf.setdefault(protocol, {}).setdefault("token", "anon")


_ours: dict[str, str] = {}


def emulator_url() -> str | None:
    """$STORAGE_EMULATOR_HOST as a URL (Google's clients accept `host:port` too); None when unset."""
    url = os.environ.get(EMULATOR)
    return (url if "://" in url else f"http://{url}") if url else None


def filesystem(path: str):
    """(fsspec filesystem, path inside it) for a URI."""
    use_emulator()
    import fsspec

    # The endpoint is part of fsspec's instance-cache key, so a process never reuses a client of another endpoint.
    gcs = path.startswith(("gs://", "gcs://")) and emulator_url()
    return fsspec.core.url_to_fs(path, **({"endpoint_url": emulator_url()} if gcs else {}))


def exists(path: str | os.PathLike) -> bool:
    if not is_uri(path):
        return Path(path).exists()
    fs, inner = filesystem(str(path))
    return fs.exists(inner)


def read_text(path: str | os.PathLike) -> str:
    if not is_uri(path):
        return Path(path).read_text()
    fs, inner = filesystem(str(path))
    return fs.cat_file(inner).decode()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a file; a local one's folders are made, as an object store needs none."""
    if not is_uri(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
        return
    fs, inner = filesystem(str(path))
    fs.pipe_file(inner, text.encode())


def append_text(path: str | os.PathLike, text: str) -> None:
    """Add `text` to the end of a file, making it when there is none (on a URI only `text` is sent: `append`)."""
    if not is_uri(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with Path(path).open("a") as f:
            f.write(text)
    elif exists(path):
        append(str(path), text.encode())
    else:
        write_text(path, text)


def read_bytes(path: str | os.PathLike) -> bytes:
    if not is_uri(path):
        return Path(path).read_bytes()
    fs, inner = filesystem(str(path))
    return fs.cat_file(inner)


def file_sizes(path: str | os.PathLike) -> dict[str, int]:
    """Every file under the folder `path` by its path relative to it (with '/'), and its size in bytes."""
    if not is_uri(path):
        root = Path(path)
        return {f.relative_to(root).as_posix(): f.stat().st_size for f in sorted(root.rglob("*")) if f.is_file()}
    fs, inner = filesystem(str(path))
    if not fs.exists(inner):
        return {}
    fs.invalidate_cache(inner)
    return {name[len(inner):].lstrip("/"): int(info["size"]) for name, info in
            sorted(fs.find(inner, detail=True).items())}


def remove(path: str | os.PathLike) -> None:
    """Delete a file or a folder with everything under it; nothing there is not an error."""
    if not is_uri(path):
        target = Path(path)
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        return
    fs, inner = filesystem(str(path))
    if fs.exists(inner):
        fs.rm(inner, recursive=True)
        fs.invalidate_cache(inner)


def list_names(path: str | os.PathLike) -> list[str]:
    """Names directly under `path` ([] when there is nothing)."""
    if not is_uri(path):
        return sorted(p.name for p in Path(path).iterdir()) if Path(path).is_dir() else []
    fs, inner = filesystem(str(path))
    if not fs.exists(inner):
        return []
    fs.invalidate_cache(inner)
    return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(inner, detail=False))


def upload(local: Path, dest: str) -> None:
    """Copy a local file, or every file under a local folder, to `dest` (a URI), replacing what is there."""
    fs, inner = filesystem(dest)
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for f in files:
        target = inner if f == local else f"{inner}/{f.relative_to(local).as_posix()}"
        fs.put_file(str(f), target)


def write_bytes(dest: str, data: bytes) -> None:
    """Replace the object `dest` (a URI) with `data`."""
    fs, inner = filesystem(dest)
    fs.pipe_file(inner, data)


def append(dest: str, data: bytes) -> None:
    """Add `data` to the end of the object `dest` (a URI that exists), sending only `data`.

    On gs:// the bytes go up as an object of their own and Cloud Storage composes the two server-side into `dest`
    (its documented way to append: "Composite objects are useful for making appends to an existing object",
    cloud.google.com/storage/docs/composite-objects); the part is deleted after. Another scheme has no compose, so
    there the object is read back and written whole.
    """
    if not data:
        return
    fs, inner = filesystem(dest)
    if not dest.startswith(("gs://", "gcs://")):
        fs.pipe_file(inner, fs.cat_file(inner) + data)
        return
    part = f"{inner}.part-{uuid.uuid4().hex}"
    fs.pipe_file(part, data)
    try:
        fs.merge(inner, [inner, part])
    finally:
        fs.rm_file(part)
    fs.invalidate_cache(inner)


def download(src: str, local: Path) -> bool:
    """Copy the object or the objects under `src` (a URI) to `local`; False when there is nothing there."""
    fs, inner = filesystem(src)
    if not fs.exists(inner):
        return False
    if fs.isfile(inner):
        local.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(inner, str(local))
        return True
    for obj in fs.find(inner):
        target = local / obj[len(inner):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(obj, str(target))
    return True


def write_folder(dest: str | os.PathLike, write: Callable[[Path], Path]) -> str:
    """`write(folder)` straight into a local `dest`, or into a temporary folder then uploaded to a URI `dest`;
    returns `dest`."""
    if not is_uri(dest):
        return str(write(Path(dest)))
    with tempfile.TemporaryDirectory(prefix="aha-upload-") as tmp:
        upload(write(Path(tmp) / "out"), str(dest))
    return str(dest)


@contextlib.contextmanager
def local_folder(src: str | os.PathLike) -> Iterator[Path]:
    """A local folder with `src`'s files: `src` itself when local, else a temporary download of the URI."""
    if not is_uri(src):
        yield Path(src)
        return
    with tempfile.TemporaryDirectory(prefix="aha-download-") as tmp:
        download(str(src), Path(tmp) / "in")
        yield Path(tmp) / "in"

