"""A multi-turn sample's tokens: appended, never re-tokenised, and environment tokens masked out of the loss.

The continuation ids (`PromptRenderer.continuation`) are checked against the chat template rendering the whole
conversation: for SmolLM2's ChatML the pieces must concatenate to exactly its tokenisation when the model ends its turn
with eos, and supply the end-of-turn token when a stop string ended it. `pack` must put a 0 loss mask (and a 0 engine
logprob) at every environment token and leave the model's tokens as single-turn packing does.
"""

from __future__ import annotations

import numpy as np
import pytest

from learner.batch import TrainBatch, pack
from tasks.render import PromptRenderer

OPENING = [{"role": "system", "content": "Guess a number."}, {"role": "user", "content": "From 1 to 16."}]


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return PromptRenderer(tiny_model_dir)


def test_appended_pieces_equal_the_rendered_conversation_when_the_model_ends_with_eos(renderer):
    tok = renderer.tokenizer
    turns = ["8", "12", "<calculator>3 * 4"]
    replies = [[{"role": "user", "content": "Higher."}], [{"role": "tool", "content": "12"}]]
    ids = renderer.encode_messages(OPENING)
    conversation = list(OPENING)
    for turn, reply in zip(turns, replies):
        sampled = tok.encode(turn, add_special_tokens=False) + [renderer.eos_token_id]  # the engine's ids, eos last
        ids += sampled + renderer.continuation(reply, sampled[-1])
        conversation += [{"role": "assistant", "content": turn}, *reply]
    assert ids == tok.encode(renderer.chat_text(conversation), add_special_tokens=False)


def test_a_turn_ended_by_a_stop_string_gets_the_end_of_turn_token_from_the_environment(renderer):
    tok = renderer.tokenizer
    ended_by_eos = renderer.continuation([{"role": "user", "content": "Lower."}], renderer.eos_token_id)
    ended_by_stop = renderer.continuation([{"role": "user", "content": "Lower."}], tok.encode("8")[-1])
    assert ended_by_stop == [renderer.eos_token_id] + ended_by_eos
    assert tok.decode(ended_by_stop).startswith("<|im_end|>\n<|im_start|>user\nLower.<|im_end|>")
    assert tok.decode(ended_by_eos).endswith("<|im_start|>assistant\n")


def test_assistant_prefix_opens_every_turn(tiny_model_dir):
    renderer = PromptRenderer(tiny_model_dir, assistant_prefix="<think>")
    assert renderer.tokenizer.decode(renderer.continuation([{"role": "user", "content": "x"}], None)).endswith(
        "assistant\n<think>")


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_model_dir):
    renderer = PromptRenderer(tiny_model_dir)
    # Renders only the last two messages: appending a turn changes what came before.
    renderer.tokenizer.chat_template = ("{% for m in messages[-2:] %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                                        "{% endif %}")
    with pytest.raises(ValueError, match="renders earlier turns differently"):
        renderer.continuation([{"role": "user", "content": "x"}], None)


def test_pack_masks_environment_tokens_out_of_loss_and_logprobs():
    prompt, completion = [5, 6, 7], [10, 11, 20, 21, 22, 12, 13]
    mask = [1, 1, 0, 0, 0, 1, 1]  # two model turns around an environment reply
    engine = [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4]
    batch = TrainBatch([prompt], [completion], [engine], np.ones(1), np.zeros(1, np.int32), completion_mask=[mask])
    single = TrainBatch([prompt], [completion], [engine], np.ones(1), np.zeros(1, np.int32))
    masked, plain = pack(batch, 8), pack(single, 8)
    # Completion token j is predicted from position len(prompt) - 1 + j.
    at = len(prompt) - 1 + np.arange(len(completion))
    assert masked.loss_mask[0, at].tolist() == mask
    assert masked.engine_logprobs[0, at].tolist() == pytest.approx([-0.1, -0.2, 0, 0, 0, -0.3, -0.4])
    assert plain.loss_mask[0, at].tolist() == [1] * len(completion)
    # Everything else (tokens, targets, the logprob window) is the single-turn packing.
    for name in ("tokens", "targets", "valid", "window"):
        assert np.array_equal(getattr(masked, name), getattr(plain, name)), name


def test_train_batch_checks_mask_lengths():
    with pytest.raises(ValueError, match="a mask of 2"):
        TrainBatch([[1]], [[2, 3, 4]], [[0.0] * 3], np.zeros(1), np.zeros(1), completion_mask=[[1, 0]])
