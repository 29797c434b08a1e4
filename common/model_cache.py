"""Where prepared models (and the project's envs) live on a machine: `$AHA_CACHE`, default ~/.cache/aha.

The run config resolves a model by name here, the CLIs that make models write here, and tests read the tiny ones;
one home for that path, so none of them has to import another's module to find it.
"""

from __future__ import annotations

import os
from pathlib import Path

# The models the project makes (orchestration/cli/prepare_model.py); nothing is downloaded.
SMOLLM2 = "smollm2-135m-instruct"
GEMMA3_270M = "gemma3-270m"
TINY = "tiny-llama"


def cache_dir() -> Path:
    """Where models and envs live: $AHA_CACHE, default ~/.cache/aha."""
    return Path(os.environ.get("AHA_CACHE", Path.home() / ".cache" / "aha")).expanduser()


def model_dir(name: str) -> Path:
    """Path of a prepared model by name (`smollm2-135m-instruct`, `tiny-llama`)."""
    return cache_dir() / "models" / name
