"""The reward functions of docs/your_own_task.md, in TRL's signature: any TRL GRPO reward function works the same.

`prompts` and `completions` come one per sample; every other column of the data row arrives as a keyword list
(here `answer`). Model output is hostile input: parse it with bounded work, never eval it.
"""

import re

NUMBER = re.compile(r"-?\d+")


def text_of(completion):
    """A completion is a string for a text prompt, [{"role": "assistant", "content": ...}] for a chat prompt."""
    return completion[0]["content"] if isinstance(completion, list) else completion


def correct_answer(prompts, completions, answer, **kwargs):
    """1.0 when the last number in the reply is the row's answer, else 0.0."""
    scores = []
    for completion, expected in zip(completions, answer):
        numbers = NUMBER.findall(text_of(completion)[:200])  # bounded work on hostile text
        scores.append(1.0 if numbers and numbers[-1] == expected else 0.0)
    return scores


def brevity(prompts, completions, max_chars=20, **kwargs):
    """0 for a reply of at most `max_chars` characters, down to -1 for one five times as long."""
    return [-min(1.0, max(0, len(text_of(c)) - max_chars) / (4 * max_chars)) for c in completions]
