"""Stop a run whose engine samples from another model than the learner trains.

At the first step of a run the learner scores the engine's own samples, so `learner/logprob_abs_diff` (per
token) measures how far the learner's model is from the engine's before any training. A broken family mapping
shows up there (gemma3 once gave 0.42/token with exit 0): every importance weight and PPO ratio would then be
meaningless, so the run stops with one line naming the family and the gap instead of training on.
"""

from __future__ import annotations

from orchestration.config.schema import RunConfig


class EngineMismatchError(RuntimeError):
    """The learner's model is not the engine's (family config mapping or weights differ)."""


def check_engine_agreement(cfg: RunConfig, steps_done: int, metrics: dict[str, float]) -> None:
    """On the first step of this process (`steps_done` == 1), raise if the gap exceeds the learner's bound."""
    bound = cfg.learner.engine_gap_bound
    gap = metrics.get("learner/logprob_abs_diff")
    if steps_done != 1 or bound is None or gap is None or gap <= bound:
        return
    from learner.model import family_of, read_hf_config

    family = family_of(read_hf_config(cfg.model.resolved_path))
    raise EngineMismatchError(
        f"{family}: learner and engine logprobs differ by {gap:.3g} per token at the first step (bound {bound:g}, "
        f"learner.max_engine_gap): the learner's {family} model is not the engine's; fix the mapping, not the bound")
