"""Groups of samples for prompts, single-turn or multi-turn, and what the rewards read of each sample.

The training loop and the evals draw samples the same way: without an environment, one engine request per prompt
(n completions each, rendered with the chat template); with one, n episodes per row (tasks/episodes.py), whose
prompt is the environment's opening. Either way a sample is a `Completion`, and the text the rewards score is the
assistant's turn as a reader sees it (the forced assistant prefix, then the model's text). The engine is any
object with the rollout handle's `generate` (rollout/protocol.py); tasks/ does not import rollout/.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.sampling import Completion, SamplingParams
from tasks.environments.base import Environment
from tasks.episodes import Limits, play
from tasks.prompt import Prompt
from tasks.render import PromptRenderer


@dataclass
class Groups:
    """One group of samples per prompt, in prompt order."""

    prompt_ids: list[list[int]]
    """Each prompt's token ids (an episode's: its opening)."""
    texts: list[str]
    """Each prompt as the model read it (chat template applied)."""
    completions: list[list[Completion]]
    answers: list[list[str]]
    """What the rewards read of each sample: the model's (last) turn, with the assistant prefix."""


def sample_groups(rollout: Any, renderer: PromptRenderer, prompts: Sequence[Prompt], params: SamplingParams, *,
                  environment: Environment | None = None, limits: Limits | None = None,
                  seeds: list[int] | None = None, on_sent: Callable[[], None] | None = None,
                  concurrency: int = 64, adapter: str | None = None) -> Groups:
    """params.n samples of each prompt (with an environment: episodes) from the served adapter `adapter` (None: the
    base model), `seeds` one per prompt; `on_sent` runs once as the first request goes out."""
    if environment is None:
        prompt_ids = [renderer.encode(p) for p in prompts]
        completions = rollout.generate(prompt_ids, params, seeds=seeds, on_sent=on_sent, adapter=adapter)
        answers = [[renderer.turn(p, c.text) for c in group] for p, group in zip(prompts, completions)]
        return Groups(prompt_ids, [renderer.text(p) for p in prompts], completions, answers)
    groups = play(rollout, renderer, environment, prompts, params, limits, seeds, on_sent, concurrency, adapter)
    # Every turn of an episode opens with the assistant prefix: the rewards read the last one as a reader sees it.
    answers = [[renderer.assistant_prefix + c.text for c in g.samples] for g in groups]
    return Groups([g.prompt_ids for g in groups], [g.text for g in groups], [g.samples for g in groups], answers)
