"""A reward that varies on the tiny random model, so its GRPO groups have non-zero advantages and the LoRA moves.

`rewards.terms=[{fn: "tests.integration.varying_reward:even_tokens"}]`: the fraction of a completion's token ids
that are even. The tiny model's rewards on every real task are 0 (it never answers), which leaves every advantage 0
and the LoRA where it started: a test that checks a restore must restore weights that moved.
"""


def even_tokens(prompts, completions, completion_ids, **kwargs):
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]
