"""A sample request's logprob options and their answer in the SDK's shapes (orchestration/service/sampling.py), on
vLLM-shaped choices as rollout/server_process.py parses them, read back by the SDK's own proto reader. The live
engine's answers are checked in tests/integration/test_tinker_service.py; here the corner cases: a row of K + 1
entries (vLLM adds the actual token when it is not in the top K), short and empty rows, the last N positions, and
the per-engine refusals. On the old main the module did not exist and the server refused every one of these options.
"""

from __future__ import annotations

import math

import pytest
from tinker.proto.response_conv import deserialize_sample_response

from common.sampling import Completion
from orchestration.service.futures import UserError
from orchestration.service.sampling import answer, logprob_ask, target_params
from orchestration.service.wire import sample_response

PROMPT = [11, 12, 13, 14]
# vLLM's prompt_logprobs for PROMPT with prompt_logprobs=2: None first, then the top 2 plus the prompt token when
# it is not among them (position 2: token 13 has rank 3)
PROMPT_ROWS = [None, {"12": {"logprob": -0.1, "rank": 1}, "7": {"logprob": -3.0, "rank": 2}},
               {"13": {"logprob": -4.0, "rank": 3}, "5": {"logprob": -0.5, "rank": 1}, "6": {"logprob": -1.5,
                                                                                             "rank": 2}},
               {"14": {"logprob": -0.2, "rank": 1}, "9": {"logprob": -2.0, "rank": 2}}]


def completion() -> Completion:
    """Two sampled tokens with logprobs=2 and token-id keys: the first sampled outside the top 2, the second its top."""
    top = [{"token_id:40": -5.0, "token_id:41": -0.3, "token_id:42": -1.4}, {"token_id:43": -0.05,
                                                                                "token_id:44": -3.2}]
    return Completion(token_ids=[40, 43], logprobs=[-5.0, -0.05], text="", finish_reason="length",
                      extra={"prompt_logprobs": PROMPT_ROWS, "top_logprobs": top})


def test_topk_rows_are_the_k_most_likely_first_and_the_first_position_is_none():
    ask = logprob_ask({"prompt_logprobs": True, "topk_prompt_logprobs": 2, "topk_sample_logprobs": 2},
                      len(PROMPT), "vllm", 20)
    out = deserialize_sample_response(sample_response([completion()], answer([completion()], PROMPT, ask)))
    assert out.prompt_logprobs[0] is None and out.prompt_logprobs[1:] == pytest.approx([-0.1, -4.0, -0.2])
    assert out.topk_prompt_logprobs == [None, [(12, pytest.approx(-0.1)), (7, -3.0)], [(5, -0.5), (6, -1.5)],
                                        [(14, pytest.approx(-0.2)), (9, -2.0)]]
    assert out.sequences[0].topk_logprobs == [[(41, pytest.approx(-0.3)), (42, pytest.approx(-1.4))],
                                              [(43, pytest.approx(-0.05)), (44, pytest.approx(-3.2))]]


def test_last_n_leaves_the_earlier_positions_empty():
    ask = logprob_ask({"prompt_logprobs": True, "topk_prompt_logprobs": 3, "prompt_logprobs_last_n": 1},
                      len(PROMPT), "vllm", 20)
    out = deserialize_sample_response(sample_response([completion()], answer([completion()], PROMPT, ask)))
    assert out.prompt_logprobs[:3] == [None] * 3 and out.prompt_logprobs[3] == pytest.approx(-0.2)
    # a row with fewer entries than k is padded with the SDK's sentinel, which its reader drops
    assert out.topk_prompt_logprobs == [None] * 3 + [[(14, pytest.approx(-0.2)), (9, -2.0)]]
    assert out.sequences[0].topk_logprobs is None and not math.isnan(out.sequences[0].logprobs[0])


@pytest.mark.parametrize(("body", "engine", "match"), [
    ({"target_prompt_logprobs": {"data": [1], "dtype": "int64", "shape": [1, 1]}}, "vllm",
     r"target_prompt_logprobs: an int64 tensor of shape \[len\(prompt\) - 1, K\] = \[3, K\]"),
    ({"target_prompt_logprobs": {"data": [-1] * 3, "dtype": "int64", "shape": [3, 1]}}, "vllm", "names no id"),
    ({"target_prompt_logprobs": {"data": [5, 6, -1], "dtype": "int64", "shape": [3, 1]}}, "sglang_jax",
     "target_prompt_logprobs: not served on sglang_jax"),
    ({"prompt_alt_tokens_k": 2}, "vllm", "prompt_alt_tokens_k"),
    ({"topk_sample_logprobs": 21}, "vllm", r"topk_sample_logprobs \(21\).*max_logprobs"),
    ({"prompt_logprobs": True, "prompt_logprobs_last_n": 4}, "vllm", r"between 1 and len\(prompt\) - 1 \(3\)"),
    ({"prompt_logprobs_last_n": 2}, "vllm", "applies to prompt logprobs"),
    ({"topk_prompt_logprobs": 2}, "sglang_jax", "topk_prompt_logprobs: not served on sglang_jax"),
    ({"topk_sample_logprobs": 2}, "sglang_jax", "topk_sample_logprobs: not served on sglang_jax"),
])
def test_an_option_the_engine_cannot_answer_is_one_line_naming_it(body, engine, match):
    with pytest.raises(UserError, match=match):
        logprob_ask(body, len(PROMPT), engine, 20)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_target_logprobs_come_back_in_the_requests_layout(sparse):
    """Ids named at prompt positions 2 and 3 (rows 1 and 2; row 0 names none, so it is not scored): each cell gets
    the logprob of its id from that row's scoring request, 0.0 where -1; a sparse request is answered sparse."""
    ids = [[-1, -1], [5, 8], [-1, 14]]
    body = ({"data": [5, 8, 14], "dtype": "int64", "shape": [3, 2], "sparse_crow_indices": [0, 0, 2, 3],
             "sparse_col_indices": [0, 1, 1]} if sparse else
            {"data": [t for row in ids for t in row], "dtype": "int64", "shape": [3, 2]})
    ask = logprob_ask({"target_prompt_logprobs": body}, len(PROMPT), "vllm", 20)
    assert ask.target.rows() == {1: [5, 8], 2: [14]}
    assert target_params([5, 8]).extra["logprob_token_ids"] == [5, 8]
    scored = {1: Completion([8], [-0.7], "", "length", extra={"top_logprobs": [{"token_id:8": -0.7,
                                                                                  "token_id:5": -2.5}]}),
              2: Completion([3], [-0.1], "", "length", extra={"top_logprobs": [{"token_id:3": -0.1,
                                                                                 "token_id:14": -6.0}]})}
    out = deserialize_sample_response(sample_response([completion()], answer([completion()], PROMPT, ask, scored)))
    got = out.target_prompt_logprobs
    if sparse:  # the SDK densifies a sparse tensor through torch, which this env lacks: read the CSR as sent
        assert (got.sparse_crow_indices, got.sparse_col_indices) == ([0, 0, 2, 3], [0, 1, 1]) and got.shape == [3, 2]
        assert list(got.data) == [-2.5, pytest.approx(-0.7), -6.0]
    else:
        assert got.to_numpy().tolist() == [[0.0, 0.0], [-2.5, pytest.approx(-0.7)], [0.0, -6.0]]
