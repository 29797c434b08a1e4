"""SGLang-JAX backend pieces that need no server: config, request validation and translation, response parsing,
and the model-folder view for transformers 4.55. Fast; runs without the SGLang-JAX env.

The engine modules (`rollout/sglang_jax_engine/`) import only the standard library at module level, so their pure
functions are tested here from the learner env.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollout.capabilities import check_sampling
from rollout.sglang_jax_config import SglangJaxConfig
from rollout.sglang_jax_engine import patches, wire
from rollout.sglang_jax_server import SglangJaxBackend
from common.sampling import SamplingParams


def test_config_defaults_and_interpreter(monkeypatch, tmp_path):
    cfg = SglangJaxConfig()
    assert cfg.kind == "sglang_jax" and cfg.max_model_len > 0 and cfg.max_logprobs == 20
    monkeypatch.setenv("AHA_SGLANG_PYTHON", str(tmp_path / "py"))
    assert SglangJaxConfig().interpreter == tmp_path / "py"
    assert SglangJaxConfig(python="/x/python").interpreter == Path("/x/python")
    with pytest.raises(ValidationError, match="extra"):
        SglangJaxConfig(gpu_memory_utilization=0.5)


@pytest.mark.parametrize("update, field", [({"repetition_penalty": 1.2}, "repetition_penalty"),
                                           ({"seed": 3}, "seed")])
def test_unhonoured_parameters_are_rejected_naming_engine_and_field(update, field):
    params = SamplingParams(**update)
    with pytest.raises(ValueError, match=f"sampling.{field} .*sglang_jax") as info:
        check_sampling(SglangJaxConfig(), params)
    assert "\n" not in str(info.value)
    backend = SglangJaxBackend(SglangJaxConfig(), Path("/nonexistent"))
    with pytest.raises(ValueError, match=field):
        backend.build_payload([1, 2], params, None)
    # The server refuses them too (a client that bypasses our validation).
    assert field in wire.unsupported(params.to_payload(), deterministic=False)


def test_seed_is_allowed_with_deterministic_sampling():
    params = SamplingParams(seed=3, n=2)
    check_sampling(SglangJaxConfig(deterministic_sampling=True), params)
    assert wire.unsupported(params.to_payload(), deterministic=True) is None
    seeds = [wire.sampling_params(params.to_payload(), i)["sampling_seed"] for i in range(2)]
    assert seeds == [3, 4], "the n samples of a seeded request must get distinct, reproducible seeds"


def test_payload_and_engine_sampling_params():
    backend = SglangJaxBackend(SglangJaxConfig(served_model_name="base"), Path("/nonexistent"))
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, presence_penalty=0.3,
                            frequency_penalty=0.2, stop=["\n\n"], stop_token_ids=[2], n=4, max_tokens=33,
                            min_tokens=3, logprobs=2, ignore_eos=True, skip_special_tokens=False)
    payload = backend.build_payload([5, 6, 7], params, "policy-v3")
    assert payload["model"] == "policy-v3" and payload["prompt"] == [5, 6, 7] and payload["n"] == 4
    assert backend.build_payload([5], params, None)["model"] == "base"
    engine = wire.sampling_params(payload, 0)
    assert engine == {"max_new_tokens": 33, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
                      "presence_penalty": 0.3, "frequency_penalty": 0.2, "min_new_tokens": 3, "stop": ["\n\n"],
                      "stop_token_ids": [2], "ignore_eos": True, "skip_special_tokens": False,
                      "no_stop_trim": False, "n": 1}
    kept = SamplingParams(stop=["</answer>"], extra={"include_stop_str_in_output": True})
    assert wire.sampling_params(backend.build_payload([5], kept, None), 0)["no_stop_trim"] is True


def test_unknown_extra_fields_are_rejected_not_dropped():
    params = SamplingParams(extra={"guided_regex": "a+"})
    with pytest.raises(ValueError, match=r"sampling.extra \['guided_regex'\] is not supported by sglang_jax"):
        check_sampling(SglangJaxConfig(), params)
    assert "guided_regex" in wire.unsupported(params.to_payload(), deterministic=False)


def engine_output(ids: list[int], lps: list[float], reason: dict, top: list | None = None) -> dict:
    """An engine result as `Engine.async_generate` returns it (shape copied from a real response)."""
    meta = {"finish_reason": reason, "output_token_logprobs": [(lp, t, None) for lp, t in zip(lps, ids)]}
    if top is not None:
        meta["output_top_logprobs"] = top
    return {"text": "abc", "output_ids": [], "meta_info": meta}


def test_choice_round_trips_through_parse_choice():
    top = [[(-0.1, 7, None), (-2.5, 9, None)], [(-0.3, 8, None), (-1.5, 7, None)]]
    out = engine_output([7, 8], [-0.1, -0.3], {"type": "stop", "matched": 8}, top)
    choice = wire.choice(0, out, top_n=2)
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == 8
    ids, lps, extra = SglangJaxBackend(SglangJaxConfig(), Path("/x")).parse_choice(choice)
    assert ids == [7, 8] and lps == [-0.1, -0.3]
    assert extra["top_logprobs"] == [{"7": -0.1, "9": -2.5}, {"8": -0.3, "7": -1.5}]
    length = wire.choice(1, engine_output([1], [-0.5], {"type": "length", "length": 1}), top_n=0)
    assert length["finish_reason"] == "length" and length["logprobs"]["top_logprobs"] is None


def test_model_view_for_old_transformers(tiny_model_dir, tmp_path):
    view = patches.compat_model_dir(tiny_model_dir, tmp_path / "view")
    config = json.loads((view / "config.json").read_text())
    original = json.loads((tiny_model_dir / "config.json").read_text())
    theta = (original.get("rope_parameters") or {}).get("rope_theta", original.get("rope_theta"))
    assert config["rope_theta"] == theta, "rope_theta must be readable by transformers 4.55"
    tok = json.loads((view / "tokenizer_config.json").read_text())
    assert tok.get("tokenizer_class") != "TokenizersBackend"
    assert (view / "model.safetensors").resolve() == (tiny_model_dir / "model.safetensors").resolve()
    assert patches.compat_model_dir(view, tmp_path / "again") == view, "an old-format folder passes through"
