"""Turn task prompts into token ids for the engine, with the model's own tokenizer and chat template.

The engine takes token ids, not text, so the learner trains on exactly the ids that were sampled from (no
re-tokenisation drift between what the engine saw and what the learner scores).

A multi-turn episode grows by appending, never by re-rendering: after the model's turn (its sampled ids, kept as
they are) come the ids of `continuation(messages)`: the chat template's end of that assistant turn (unless the model
sampled it), the environment's messages, and the opening of the next assistant turn. Re-tokenising the whole
conversation instead would merge or split tokens at the turn boundaries differently from what the engine sampled,
and the learner's ratio would compare other tokens than the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.prompt import Prompt

# Stand-ins for a conversation that ends with an assistant turn: the template's text around the assistant content
# is what continues after the model's own tokens. Neither string occurs in any template.
_PROBE_USER = "\x00probe-user\x00"
_PROBE_ASSISTANT = "\x00probe-assistant\x00"


class PromptRenderer:
    """Chat prompts go through the tokenizer's chat template; base prompts are encoded as they are."""

    def __init__(self, model_path: Path, assistant_prefix: str = ""):
        from transformers import AutoTokenizer  # tokenizers only: no torch needed

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.eos_token_id = self.tokenizer.eos_token_id
        self.assistant_prefix = assistant_prefix

    def text(self, prompt: Prompt) -> str:
        if prompt.messages is not None:
            self._require_chat_template(prompt.uid, "data.template is 'chat'")
            return self.chat_text(prompt.messages)
        if prompt.text is None:
            raise ValueError(f"{prompt.uid}: prompt has neither messages nor text")
        return prompt.text

    def chat_text(self, messages: Sequence[dict[str, Any]]) -> str:
        """`messages` through the chat template, ending with the assistant turn's opening (and assistant_prefix)."""
        return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                                  tokenize=False) + self.assistant_prefix

    def turn(self, prompt: Prompt, completion: str) -> str:
        """The assistant's whole turn as a reader sees it: the forced prefix (chat prompts), then the completion.

        What the rewards score: with `data.assistant_prefix: "<answer>"` the completion alone would hold a closing
        tag without its opening one.
        """
        return (self.assistant_prefix if prompt.messages is not None else "") + completion

    def encode(self, prompt: Prompt) -> list[int]:
        # The chat template already contains any special tokens the model expects.
        return list(self.tokenizer.encode(self.text(prompt), add_special_tokens=False))

    def encode_messages(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of an episode's opening messages, ready for the model's first turn."""
        self._require_chat_template("an environment's opening", "an environment plays chat turns")
        return list(self.tokenizer.encode(self.chat_text(messages), add_special_tokens=False))

    def continuation(self, messages: Sequence[dict[str, Any]], last_token: int | None) -> list[int]:
        """Token ids that follow a finished assistant turn whose last sampled id is `last_token`: the rest of that
        turn as the template closes it, `messages`, and the next assistant turn's opening (with assistant_prefix).

        The template's closing text (e.g. `<|im_end|>\\n`) starts with the end-of-turn token when the model sampled
        it (stopping at eos), and then that token is not appended twice; a turn cut by a stop string gets it here.
        """
        closing, new = self._closing_and_glue(messages)
        if last_token is not None:
            sampled = self.tokenizer.decode([last_token], skip_special_tokens=False)
            if sampled and closing.startswith(sampled):
                closing = closing[len(sampled):]
        return list(self.tokenizer.encode(closing + new + self.assistant_prefix, add_special_tokens=False))

    def _require_chat_template(self, what: str, why: str) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{what}: {why} but the tokenizer has no chat template; use a chat model (or "
                             "data.template: base for a single-turn base model)")

    def _closing_and_glue(self, messages: Sequence[dict[str, Any]]) -> tuple[str, str]:
        """(text the template puts after an assistant turn's content, text of `messages` + the next turn's opening).

        Found by rendering a probe conversation that ends with an assistant turn, with and without `messages`; a
        template that renders the earlier turns differently once more follow (e.g. one that drops past reasoning)
        cannot be extended by appending, and is refused.
        """
        probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        before = self.tokenizer.apply_chat_template(probe, tokenize=False)
        after = self.tokenizer.apply_chat_template(probe + list(messages), add_generation_prompt=True, tokenize=False)
        if not after.startswith(before) or _PROBE_ASSISTANT not in before:
            raise ValueError("the model's chat template renders earlier turns differently once more turns follow, so "
                             "a conversation cannot grow by appending tokens; multi-turn environments need a template "
                             "that extends (ChatML-style templates do)")
        closing = before[before.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]
        return closing, after[len(before):]
