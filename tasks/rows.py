"""Random access to the rows of a user's data file, without reading the file into memory.

A run draws its prompts in a seeded, shuffled order (tasks/stream.py), so the reader must fetch row i on demand;
what it keeps is bounded, not the file:
- JSON Lines: an index of line offsets (8 bytes a row), built by one pass over the bytes; a row is one seek and
  one `json.loads`.
- Parquet: the row-group layout from the footer; a row decodes its row group, and the last few decoded groups are
  kept up to `data.parquet_cache_mb` (Parquet has no cheaper way to one row).
- A `datasets` `save_to_disk` folder: its Arrow files memory-mapped by `datasets.load_from_disk` (pages are read by
  the kernel as rows are touched and dropped under memory pressure; nothing is copied into the process).

numpy, pyarrow and datasets are imported only when such a file is opened, so `import tasks` stays cheap.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from tasks.errors import DataError

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
_CHUNK_BYTES = 16 << 20


class Rows(Protocol):
    """A data file's rows by position."""

    fingerprint: str
    """Changes when the data does (kind, size in bytes, rows): a checkpoint's data position belongs to one file."""

    def __len__(self) -> int: ...

    def row(self, index: int) -> dict[str, Any]: ...

    def where(self, index: int) -> str:
        """Where row `index` is, for error messages ("data.jsonl:17")."""
        ...


def open_rows(path: str, key: str, parquet_cache_mb: int = 256) -> Rows:
    """The rows of `path` (JSONL, Parquet or a save_to_disk folder); `key` is the config key that named it."""
    where = Path(path).expanduser()
    if where.is_dir():
        return SavedDatasetRows(where, key)
    if not where.is_file():
        raise DataError(f"{key}: {path} not found; point it at a local JSONL or Parquet file or a save_to_disk folder "
                        "(nothing is downloaded)")
    suffix = where.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return JsonlRows(where)
    if suffix in PARQUET_SUFFIXES:
        return ParquetRows(where, parquet_cache_mb << 20)
    raise DataError(f"{key}: {path} is neither JSON Lines ({', '.join(JSONL_SUFFIXES)}) nor Parquet "
                    f"({', '.join(PARQUET_SUFFIXES)}) nor a save_to_disk folder; convert it or rename it")


class JsonlRows:
    """One JSON object per line; blank lines are skipped. Keeps an int64 offset per row, never the rows."""

    def __init__(self, path: Path):
        self.path = path
        self._starts = _line_starts(path)
        self._file = None
        if not len(self._starts):
            raise DataError(f"{path} has no rows")
        self.fingerprint = f"jsonl:{path.stat().st_size}:{len(self._starts)}"

    def __len__(self) -> int:
        return len(self._starts)

    def row(self, index: int) -> dict[str, Any]:
        if self._file is None:
            self._file = self.path.open("rb")
        self._file.seek(int(self._starts[index]))
        line = self._file.readline()
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{self.where(index)}: not valid JSON ({exc}); fix or remove the line") from None
        if not isinstance(record, dict):
            raise DataError(f"{self.where(index)}: expected a JSON object per line, got {type(record).__name__}")
        return record

    def where(self, index: int) -> str:
        # Line numbers are counted only for an error message (blank lines make them differ from row positions).
        left, lines_before = int(self._starts[index]), 0
        with self.path.open("rb") as f:
            while left > 0 and (chunk := f.read(min(left, _CHUNK_BYTES))):
                lines_before += chunk.count(b"\n")
                left -= len(chunk)
        return f"{self.path}:{lines_before + 1}"


def _line_starts(path: Path):
    """Byte offsets of the lines of `path` that can hold a JSON object, as an int64 numpy array (one pass).

    A line shorter than `{}` (empty, or a lone "\r" of a CRLF file) is blank and skipped.
    """
    import numpy as np

    starts, offset, pending = [], 0, 0  # pending: where the line not ended yet starts
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10).astype(np.int64) + offset
            if len(ends):
                line_starts = np.concatenate((np.array([pending], np.int64), ends[:-1] + 1))
                starts.append(line_starts[ends - line_starts >= 2])
                pending = int(ends[-1]) + 1
            offset += len(chunk)
    if offset - pending >= 2:  # a last line without a newline
        starts.append(np.array([pending], np.int64))
    return np.concatenate(starts) if starts else np.empty(0, np.int64)


class ParquetRows:
    """Rows of a Parquet file through its row groups, the most recently decoded ones kept up to `cache_bytes`."""

    def __init__(self, path: Path, cache_bytes: int):
        import numpy as np
        import pyarrow.parquet as pq

        try:
            self._file = pq.ParquetFile(str(path))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
            raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
        meta = self._file.metadata
        sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self._starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        self.path, self._cache_bytes = path, cache_bytes
        self._cache: OrderedDict[int, Any] = OrderedDict()
        if not meta.num_rows:
            raise DataError(f"{path} has no rows")
        self.fingerprint = f"parquet:{path.stat().st_size}:{meta.num_rows}"

    def __len__(self) -> int:
        return int(self._starts[-1])

    def row(self, index: int) -> dict[str, Any]:
        import numpy as np

        group = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self._group(group).slice(index - int(self._starts[group]), 1).to_pylist()[0]

    def _group(self, group: int):
        import pyarrow as pa

        if group in self._cache:
            self._cache.move_to_end(group)
            return self._cache[group]
        # One thread: decoding threads each keep a malloc arena of freed pages (RSS that outlives the table).
        table = self._file.read_row_group(group, use_threads=False)
        self._cache[group] = table
        evicted = False
        while len(self._cache) > 1 and sum(t.nbytes for t in self._cache.values()) > self._cache_bytes:
            self._cache.popitem(last=False)
            evicted = True
        if evicted:  # Arrow's allocator keeps freed pages for reuse; over a long run they would add up to the file
            pa.default_memory_pool().release_unused()
        return table

    def where(self, index: int) -> str:
        return f"{self.path} row {index}"


class SavedDatasetRows:
    """A Hugging Face `datasets` folder from `save_to_disk` (one split), memory-mapped, decoded row by row."""

    def __init__(self, path: Path, key: str):
        import datasets

        try:
            data = datasets.load_from_disk(str(path), keep_in_memory=False)
        except FileNotFoundError as exc:
            raise DataError(f"{key}: {path} is a folder but not one written by `save_to_disk` ({exc})") from None
        if isinstance(data, datasets.DatasetDict):
            splits = sorted(data)
            raise DataError(f"{key}: {path} holds several splits {splits}; point {key} at one of them, e.g. "
                            f"{path / splits[0]}")
        if not len(data):
            raise DataError(f"{path} has no rows")
        self.path, self._data = path, data
        size = sum(f.stat().st_size for f in path.glob("*.arrow"))
        self.fingerprint = f"arrow:{size}:{len(data)}"

    def __len__(self) -> int:
        return len(self._data)

    def row(self, index: int) -> dict[str, Any]:
        return self._data[index]

    def where(self, index: int) -> str:
        return f"{self.path} row {index}"
