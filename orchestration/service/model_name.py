"""The one name `aha tinker` gives its model: its Hugging Face id, in capabilities, `get_info`, training runs and
samplers alike, and the id a client loads the tokenizer by.

The SDK loads the tokenizer on the client (`get_tokenizer()` runs `AutoTokenizer.from_pretrained` on `get_info`'s
`tokenizer_id`, and a sampling client on its base model's name), so the name must be one a client resolves away from
the server: a local folder or the config's alias would only resolve on the server's machine, if at all. Setup lays
the prepared models out as an offline Hugging Face cache under those ids (common/hf_cache.py), so with HF_HUB_CACHE
pointing at it and HF_HUB_OFFLINE=1 any machine that ran setup resolves them. The alias (`model.path`), the resolved
folder and the engines' served name stay accepted as input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestration.config.schema import ModelConfig
from orchestration.service.futures import UserError


@dataclass(frozen=True)
class ServedModel:
    name: str  # the Hugging Face id
    arch: str  # the model's family, from its config.json (llama, qwen2, qwen3, gemma3, ...)
    accepted: frozenset[str]  # every name a client may ask for it by

    def check(self, base_model: str | None) -> str:
        """The served name for a client's `base_model` (None: this one); a one-line error for another model."""
        if base_model is not None and base_model not in self.accepted:
            raise UserError(f"base_model {base_model!r}: this server trains {self.name!r} (also called "
                            f"{', '.join(repr(a) for a in sorted(self.accepted - {self.name}))}); start `aha tinker` "
                            "with another config for another model")
        return self.name

    def model_data(self) -> dict[str, Any]:
        """`get_info`'s model_data: the SDK's get_tokenizer() loads `tokenizer_id` on the client."""
        return {"arch": self.arch, "model_name": self.name, "tokenizer_id": self.name}


def served_model(model: ModelConfig, engine_name: str) -> ServedModel:
    """The name, family and accepted names of the config's model; a one-line error naming `model.hf_id` when neither
    the config nor the folder says the model's Hugging Face id."""
    name = model.resolved_hf_id
    if name is None:
        raise ValueError(f"model.hf_id: {model.resolved_path} does not say which Hugging Face model it is (no hf_id.txt, "
                         "not a Hugging Face cache snapshot); set model.hf_id=ORG/NAME, the name `aha tinker` serves it "
                         "by and its clients load the tokenizer by")
    return ServedModel(name, model_family(model), frozenset({name, model.path, str(model.resolved_path), engine_name}))


def model_family(model: ModelConfig) -> str:
    """config.json's model_type without the text-only suffix (Gemma 3's `gemma3_text` is family `gemma3`)."""
    if model.config_json is None:
        raise ValueError(f"model.path: {model.resolved_path} has no config.json (nor configs/models/<name>/ a copy)")
    return str(json.loads(model.config_json.read_text())["model_type"]).removesuffix("_text")
