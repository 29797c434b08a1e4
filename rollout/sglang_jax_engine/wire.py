"""Request translation between our rollout HTTP contract and SGLang-JAX (pure: unit-testable without the engine)."""

from __future__ import annotations

from typing import Any

ENGINE = "sglang_jax"


# Request fields the wrapper understands: SamplingParams.to_payload() plus the client's own keys and the one vLLM
# extra our configs use. Anything else is refused rather than silently dropped.
KNOWN_FIELDS = frozenset({
    "model", "prompt", "stream", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "stop", "stop_token_ids", "seed", "n", "max_tokens", "min_tokens", "logprobs", "ignore_eos",
    "skip_special_tokens", "include_stop_str_in_output",
})


def unsupported(body: dict[str, Any], deterministic: bool) -> str | None:
    """Why the request cannot be served as asked, or None."""
    if unknown := sorted(set(body) - KNOWN_FIELDS):
        return f"{ENGINE} does not support request field(s) {unknown}; remove them (e.g. from sampling.extra)"
    if float(body.get("repetition_penalty", 1.0) or 1.0) != 1.0:
        return (f"{ENGINE} does not apply repetition_penalty ({body['repetition_penalty']}); set "
                "sampling.repetition_penalty to 1.0 or use presence/frequency_penalty")
    if body.get("seed") is not None and not deterministic:
        return (f"{ENGINE} ignores seed ({body['seed']}) unless started with deterministic sampling; set "
                "rollout.backend.deterministic_sampling: true or sampling.seed: null")
    return None


def sampling_params(body: dict[str, Any], index: int) -> dict[str, Any]:
    """SGLang-JAX sampling params of sample `index` of an OpenAI-style completions body."""
    params = {
        "max_new_tokens": int(body.get("max_tokens", 16)),
        "temperature": float(body.get("temperature", 1.0)),
        "top_p": float(body.get("top_p", 1.0)),
        "top_k": int(body.get("top_k", -1)),
        "min_p": float(body.get("min_p", 0.0)),
        "presence_penalty": float(body.get("presence_penalty", 0.0)),
        "frequency_penalty": float(body.get("frequency_penalty", 0.0)),
        "min_new_tokens": int(body.get("min_tokens", 0)),
        "stop": list(body.get("stop") or []) or None,
        "stop_token_ids": list(body.get("stop_token_ids") or []) or None,
        "ignore_eos": bool(body.get("ignore_eos", False)),
        "skip_special_tokens": bool(body.get("skip_special_tokens", True)),
        "no_stop_trim": bool(body.get("include_stop_str_in_output", False)),
        "n": 1,
    }
    if body.get("seed") is not None:
        # One seed per sample, so the n samples of a seeded request differ from each other but repeat across calls.
        params["sampling_seed"] = int(body["seed"]) + index
    return params


def choice(index: int, out: dict[str, Any], top_n: int) -> dict[str, Any]:
    """One OpenAI-style choice (plus `token_ids`, as vLLM's return_token_ids gives) from an engine output."""
    meta = out["meta_info"]
    token_lps = meta.get("output_token_logprobs") or []
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    top = None
    if top_n > 0:
        top = [{str(tid): float(lp) for lp, tid, _ in step} if step else None
               for step in meta.get("output_top_logprobs") or []]
    return {
        "index": index,
        "text": out.get("text", ""),
        # Ids from the logprob entries, one per sampled token: `output_ids` comes from the incremental detokenizer,
        # which drops special tokens when skip_special_tokens is set.
        "token_ids": [int(tid) for _, tid, _ in token_lps],
        "logprobs": {"token_logprobs": [float(lp) for lp, _, _ in token_lps], "top_logprobs": top},
        "finish_reason": "length" if kind == "length" else "stop" if kind == "stop" else kind,
        "stop_reason": reason.get("matched") if isinstance(reason, dict) else None,
    }
