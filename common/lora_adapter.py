"""`LoraAdapter`: one LoRA as it crosses parts, by name: what the learner's `save_for_sampler` gives and what the
rollout handle's `serve` takes.

The name is the only identity an adapter has on the engines: a request names the adapter it samples from, a
`Completion` records it, `unserve(name)` takes it off. A trained policy's successive versions are just names
(`version_name("policy", 3)` is "policy-v3"), as are a training service's sampler versions and checkpoints. The
tensors and config are PEFT's (common/peft_adapter.py owns the format: names, files, defaults).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.peft_adapter import read_adapter, write_adapter


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """A LoRA's PEFT tensors and adapter_config under the name the engines serve it by (compared by identity: two
    adapters of the same name may hold different weights)."""

    name: str
    tensors: dict[str, np.ndarray]
    """PEFT names -> A [r, in] / B [out, r]."""
    config: dict[str, Any]
    """adapter_config.json's contents (r, lora_alpha, target_modules, ...)."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"adapter name {self.name!r}: give a non-empty name without '/' (it names a folder)")

    @property
    def rank(self) -> int | None:
        """Its LoRA rank (adapter_config's r), None if the config does not say."""
        rank = self.config.get("r")
        return None if rank is None else int(rank)

    def write(self, folder: Path) -> Path:
        """Itself as a PEFT adapter folder (adapter_model.safetensors + adapter_config.json) at `folder`."""
        return write_adapter(folder, self.tensors, self.config)

    @classmethod
    def read(cls, folder: Path, name: str) -> LoraAdapter:
        """The PEFT adapter folder `folder`, to be served as `name`."""
        return cls(name, *read_adapter(folder))


def version_name(adapter: str, version: int) -> str:
    """The served name of an adapter's `version`-th weights: a policy's step, a training client's sampler."""
    return f"{adapter}-v{version}"
