"""Data errors: a config or a data file the run cannot use, said in one line that names the file, row and fix."""

from __future__ import annotations


class DataError(ValueError):
    """A data file or a data config the run cannot use; `orchestration.cli.train` prints it as one line and exits 2."""


class DatasetTooSmall(DataError):
    """The config asks a split for more distinct items than its generator makes: a config error, said in one line."""
