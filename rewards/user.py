"""A reward by import path (`- fn: package.module:function`), called as TRL's GRPOTrainer calls reward functions.

TRL's convention (trl/trainer/grpo_trainer.py `_calculate_rewards`), kept so a TRL user's functions run unchanged:
- `prompts`: one per completion, as the dataset holds the prompt: a string for a plain-text row, a list of
  {role, content} messages for a conversational one;
- `completions`: strings for plain-text prompts; for conversational prompts, each a one-message list
  `[{"role": "assistant", "content": text}]`;
- `completion_ids`: the sampled token ids of each completion;
- every other column of the row as a keyword list (`answer=[...]`), one value per completion;
- `trainer_state` (here a TrainingProgress with `global_step` and `max_steps`), and `log_metric(name, value)` /
  `log_extra(column, values)` callables (metrics are logged as `reward/<term>/<name>`; extra columns are dropped);
- the function returns one number per completion, or None where it does not apply, in whatever TRL takes: a
  list, tuple, generator, numpy array, pandas Series...; of floats, ints, bools, numpy scalars... (rewards/worker.py
  `check_values`, tests/unit/test_reward_returns.py). A None is left out of the weighted sum, as TRL's nansum
  leaves it (NaN counts as None). Async functions are awaited.
aha calls the function once per prompt's group of completions (a batch in TRL's sense), and adds the term's
`params` as keyword arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rewards.types import Sample, TrainingProgress


class UserReward:
    """A term scored by the pool: its metric name, the pool's key for its function, and its params."""

    def __init__(self, name: str, key: int, params: Mapping[str, Any]):
        self.__name__, self.key, self.params = name, key, dict(params)

    def kwargs(self, samples: Sequence[Sample], progress: TrainingProgress | None) -> dict[str, Any]:
        """TRL's keyword arguments for one call over `samples`."""
        return {**trl_columns(samples), **self.params, **trl_inputs(samples), "trainer_state": progress}


def trl_inputs(samples: Sequence[Sample]) -> dict[str, list]:
    """`prompts`, `completions` and `completion_ids` in TRL's shapes (see the module docstring)."""
    prompts = [s.prompt if s.raw_prompt is None else s.raw_prompt for s in samples]
    chat = [isinstance(p, (list, tuple)) for p in prompts]
    return {
        "prompts": [list(p) if is_chat else p for p, is_chat in zip(prompts, chat)],
        "completions": [[{"role": "assistant", "content": s.completion}] if is_chat else s.completion
                        for s, is_chat in zip(samples, chat)],
        "completion_ids": [list(s.completion_ids) for s in samples],
    }


def trl_columns(samples: Sequence[Sample]) -> dict[str, list]:
    """Every reference column as a list over the samples (None where a sample's row lacks it)."""
    names = list(dict.fromkeys(key for s in samples for key in s.reference))
    return {name: [s.reference.get(name) for s in samples] for name in names}
