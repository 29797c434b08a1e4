"""Prompt texts and their rendering for a chat template (system + user messages) or a base model (plain text)."""

from __future__ import annotations

# No placeholder ("...") and no example answer: SmolLM2-135M copies them verbatim (greedy, the earlier prompt gave
# "The equation is: 1 + 2 = 3" on every held-out puzzle; a GRPO run converged to "...</think><answer>1 + 2</answer>").
SYSTEM_PROMPT = (
    "You are a helpful assistant. Think about the problem inside <think> </think> tags, "
    "then write only the final answer inside <answer> </answer> tags."
)
# TinyZero's base-model prefix: the prompt opens the think block so the completion starts reasoning at once.
BASE_PREFIX = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer.\n"
    "User: {user}\nAssistant: Let me solve this step by step.\n<think>"
)
COUNTDOWN_USER = (
    "Using the numbers {numbers}, create an equation that equals {target}. "
    "You can use + - * / and each number exactly once."
)
MATH_USER = "{question}\nShow your reasoning in <think> </think> and give only the final number in <answer> </answer>."


def render(user: str, template: str, system: str | None = None) -> tuple[tuple[dict[str, str], ...] | None, str | None]:
    """(chat messages, None) for the chat template (system: None = SYSTEM_PROMPT), (None, plain text) for a base
    model."""
    if template == "chat":
        return ({"role": "system", "content": SYSTEM_PROMPT if system is None else system},
                {"role": "user", "content": user}), None
    return None, BASE_PREFIX.format(user=user)
