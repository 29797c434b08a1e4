"""Turn task prompts into token ids for the engine, with the model's own tokenizer and chat template.

The engine takes token ids, not text, so the learner trains on exactly the ids that were sampled from (no
re-tokenisation drift between what the engine saw and what the learner scores).
"""

from __future__ import annotations

from pathlib import Path

from tasks.dataset import Prompt


class PromptRenderer:
    """Chat prompts go through the tokenizer's chat template; base prompts are encoded as they are."""

    def __init__(self, model_path: Path, assistant_prefix: str = ""):
        from transformers import AutoTokenizer  # tokenizers only: no torch needed

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.eos_token_id = self.tokenizer.eos_token_id
        self.assistant_prefix = assistant_prefix

    def text(self, prompt: Prompt) -> str:
        if prompt.messages is not None:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError(f"{prompt.uid}: data.template is 'chat' but the tokenizer has no chat template; "
                                 "set data.template: base for a base model")
            return self.tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True,
                                                      tokenize=False) + self.assistant_prefix
        if prompt.text is None:
            raise ValueError(f"{prompt.uid}: prompt has neither messages nor text")
        return prompt.text

    def turn(self, prompt: Prompt, completion: str) -> str:
        """The assistant's whole turn as a reader sees it: the forced prefix (chat prompts), then the completion.

        What the rewards score: with `data.assistant_prefix: "<answer>"` the completion alone would hold a closing
        tag without its opening one.
        """
        return (self.assistant_prefix if prompt.messages is not None else "") + completion

    def encode(self, prompt: Prompt) -> list[int]:
        # The chat template already contains any special tokens the model expects.
        return list(self.tokenizer.encode(self.text(prompt), add_special_tokens=False))
