"""The offline Hugging Face cache setup lays out (common/hf_cache.py) and the name `aha tinker` serves a model by
(orchestration/service/model_name.py), on the prepared models' real folders and scratch copies of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common.hf_cache import hf_id_of, lay_out
from common.model_cache import GEMMA3_270M, SMOLLM2, TINY, hf_id, model_dir
from orchestration.config.schema import ModelConfig
from orchestration.service.futures import UserError
from orchestration.service.model_name import served_model


def offline_tokenizer(hub: Path, name: str):
    """`AutoTokenizer.from_pretrained(name)` reading `hub` alone, as HF_HUB_CACHE=hub HF_HUB_OFFLINE=1 make it (the
    integration tests set exactly those in a client process: tests/integration/test_tinker_service.py)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, cache_dir=hub, local_files_only=True)


def test_a_laid_out_model_loads_by_its_id_offline_and_a_remade_one_is_a_new_snapshot(tmp_path):
    """A copy of tiny-llama's folder laid out as `aha-tiny/x`: from_pretrained("aha-tiny/x") with the Hub offline
    gives its tokenizer (an id not laid out fails: the test's own control); the folder now says its id; laying out
    again is a no-op, and after a file changes refs/main names a new snapshot."""
    folder = tmp_path / "models" / "x"
    shutil.copytree(model_dir(TINY), folder, ignore=shutil.ignore_patterns("*.safetensors", "hf_id.txt"))
    hub = tmp_path / "hub"
    assert hf_id_of(folder) is None
    snapshot = lay_out(folder, "aha-tiny/x", hub)
    assert hf_id_of(folder) == "aha-tiny/x" and lay_out(folder, "aha-tiny/x", hub) == snapshot
    got = offline_tokenizer(hub, "aha-tiny/x")
    assert got.name_or_path == "aha-tiny/x" and got.eos_token == "<|im_end|>" and len(got.encode("Hello")) >= 1
    with pytest.raises(OSError):
        offline_tokenizer(hub, "aha-tiny/y")
    (folder / "generation_config.json").write_text("{}")
    again = lay_out(folder, "aha-tiny/x", hub)
    assert again != snapshot and (hub / "models--aha-tiny--x" / "refs" / "main").read_text() == again.name
    assert hf_id_of(again) == "aha-tiny/x", "a Hub cache snapshot is named by its place"


@pytest.mark.parametrize("name", [SMOLLM2, TINY])
def test_setup_laid_the_prepared_models_out_by_their_ids(name):
    """What setup made: each prepared model's folder says its id, and the id loads its tokenizer offline from the
    cache setup laid out, the same tokenizer as the folder's (fails before setup lays the cache out)."""
    from transformers import AutoTokenizer

    from common.hf_cache import hub_dir

    assert hf_id_of(model_dir(name)) == hf_id(name)
    got, folder = offline_tokenizer(hub_dir(), hf_id(name)), AutoTokenizer.from_pretrained(model_dir(name))
    text = "Hello world <|im_end|>"
    assert got.name_or_path == hf_id(name) and got.encode(text) == folder.encode(text) and got.eos_token == "<|im_end|>"


@pytest.mark.parametrize(("name", "arch"), [(SMOLLM2, "llama"), ("tiny-qwen3", "qwen3"), ("tiny-qwen2", "qwen2"),
                                            ("tiny-gemma3", "gemma3"), (GEMMA3_270M, "gemma3")])
def test_the_served_name_is_the_hf_id_and_arch_the_family(name, arch):
    """get_info's arch is the model's family from its config.json (the old server said "llama" for every model);
    the alias, the folder and the engines' name are accepted and answered with the id."""
    model = ModelConfig(path=name)
    served = served_model(model, "base")
    assert (served.name, served.arch) == (hf_id(name), arch)
    assert {served.check(n) for n in (None, name, str(model_dir(name)), "base", hf_id(name))} == {hf_id(name)}
    with pytest.raises(UserError, match=f"this server trains '{hf_id(name)}'"):
        served.check("meta-llama/Llama-3.1-8B")


def test_a_folder_that_does_not_say_its_id_needs_model_hf_id(tmp_path):
    """A model folder without hf_id.txt outside a Hub cache: one line naming model.hf_id; with it set, that id."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(model_dir(TINY) / "config.json", folder)
    with pytest.raises(ValueError, match=r"^model.hf_id: .* set model.hf_id=ORG/NAME"):
        served_model(ModelConfig(path=str(folder)), "base")
    assert served_model(ModelConfig(path=str(folder), hf_id="me/mine"), "base").name == "me/mine"
    with pytest.raises(ValueError, match="hf_id"):
        ModelConfig(path=str(folder), hf_id="not an id")
