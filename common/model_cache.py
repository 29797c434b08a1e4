"""Where prepared models (and the project's envs) live on a machine: `$AHA_CACHE`, default ~/.cache/aha.

The run config resolves a model by name here, the CLIs that make models write here, and tests read the tiny ones;
one home for that path, so none of them has to import another's module to find it. Each prepared model also has a
Hugging Face id (`hf_id`): the name `aha tinker` serves it by and its clients load its tokenizer by, from the offline
Hugging Face cache setup lays out beside the models (common/hf_cache.py).
"""

from __future__ import annotations

import os
from pathlib import Path

# The models the project makes (orchestration/cli/prepare_model.py); nothing is downloaded.
SMOLLM2 = "smollm2-135m-instruct"
GEMMA3_270M = "gemma3-270m"
TINY = "tiny-llama"
# The seeded tiny random models (orchestration/cli/tiny_models.py) are nobody's on the Hub: a made-up organisation
# names them, which no Hub repository uses, so a client never mistakes one for a real model.
TINY_ORG = "aha-tiny"
HF_IDS = {SMOLLM2: "HuggingFaceTB/SmolLM2-135M-Instruct", GEMMA3_270M: "google/gemma-3-270m"}


def hf_id(name: str) -> str:
    """The Hugging Face id of a model the project makes (`smollm2-135m-instruct`, `tiny-qwen3`)."""
    if name in HF_IDS:
        return HF_IDS[name]
    if name.startswith("tiny-"):
        return f"{TINY_ORG}/{name}"
    raise ValueError(f"{name!r} is not a model the project makes; pass its Hugging Face id (ORG/NAME) yourself")


def cache_dir() -> Path:
    """Where models and envs live: $AHA_CACHE, default ~/.cache/aha."""
    return Path(os.environ.get("AHA_CACHE", Path.home() / ".cache" / "aha")).expanduser()


def model_dir(name: str) -> Path:
    """Path of a prepared model by name (`smollm2-135m-instruct`, `tiny-llama`)."""
    return cache_dir() / "models" / name
