"""common/lora_adapter.py: the one adapter value that crosses from the learner to the engines, by name."""

from __future__ import annotations

import numpy as np
import pytest

from common import peft_adapter
from common.lora_adapter import LoraAdapter, version_name


def test_an_adapter_writes_itself_as_a_peft_folder_and_reads_back_under_a_name(tmp_path):
    """`write` is common/peft_adapter.py's format (the folder the engines load), `read` gives it the name it is
    served by; a version is just a name, the same for the GRPO loop and the Tinker service (fails on main at
    fe1415a, which had no LoraAdapter: the learner handed over a bare (tensors, config) tuple)."""
    rng = np.random.default_rng(0)
    tensors = {peft_adapter.tensor_name(0, "q_proj", ab): rng.normal(size=shape).astype(np.float32)
               for ab, shape in (("A", (4, 16)), ("B", (16, 4)))}
    adapter = LoraAdapter("policy-v3", tensors, {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]})
    assert adapter.rank == 4
    folder = adapter.write(tmp_path / "out")
    again = LoraAdapter.read(folder, "ckpt-1")
    assert again.name == "ckpt-1" and again.rank == 4
    assert peft_adapter.checksum(again.tensors) == peft_adapter.checksum(tensors)
    assert again.config == {**peft_adapter.PEFT_DEFAULTS, **adapter.config}
    assert version_name("policy", 3) == adapter.name


@pytest.mark.parametrize("name", ["", "a/b"])
def test_a_name_that_cannot_be_served_is_refused(name):
    with pytest.raises(ValueError, match="give a non-empty name without '/'"):
        LoraAdapter(name, {}, {})
