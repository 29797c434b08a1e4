"""A step's row of figures from its samples (rewards, lengths, episodes), and the samples people read.

The loop assembles each metrics.jsonl row from three sources: this module (what was drawn and scored), the learner
(`learner/...`) and the loop's own timings. Reward figures come from `rewards.reward_metrics`, where each reward
result says which of its figures are counters (summed over a step's draws) and which are means.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from common.sampling import Completion
from orchestration.dynamic_sampling import Drawn
from orchestration.run_dir import RunDir
from orchestration.state import StepBatch
from rewards.registry import reward_metrics
from tasks.episodes import episode_metrics


def draw_metrics(drawn: Drawn) -> dict[str, float]:
    """Reward and rollout figures over every sample drawn this step (all draws, trained on or not)."""
    flat = [c for group in drawn.completions for c in group]
    return {
        "reward/total": float(np.mean(drawn.totals)),
        "reward/total_std": float(np.std(drawn.totals)),
        **reward_metrics(drawn.rewards),
        **rollout_metrics(flat, drawn.seconds["generate"]),
        "rollout/restarts": drawn.restarts,
        "timing/generate": drawn.seconds["generate"],
        "timing/score": drawn.seconds["score"],
    }


def rollout_metrics(flat: Sequence[Completion], t_gen: float) -> dict[str, float]:
    """Lengths and speed of the model's own tokens (an episode's environment tokens are not generated)."""
    lengths = np.array([c.model_tokens for c in flat])
    out = {
        "rollout/completion_len_mean": float(lengths.mean()),
        "rollout/completion_len_max": int(lengths.max()),
        "rollout/truncated_frac": float(np.mean([c.finish_reason == "length" for c in flat])),
        "rollout/tokens_per_s": float(lengths.sum() / max(t_gen, 1e-9)),
    }
    episodes = [c for c in flat if c.episode is not None]
    if episodes:
        out.update(episode_metrics(episodes))
    return out


def log_samples(run_dir: RunDir, batch: StepBatch) -> None:
    """Keep one prompt's group of completions (an episode: its transcript) per step, for people reading what the
    policy does."""
    group = batch.completions[0]
    row = {"step": batch.step, "prompt": batch.texts[0], "completions": [c.text for c in group],
           "rewards": batch.totals[: len(group)]}
    if group[0].episode is not None:
        row["episodes"] = [{"transcript": c.episode.transcript, "end": c.episode.end, "env_reward": c.env_reward}
                           for c in group]
    with (run_dir.local / "samples.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    run_dir.sync("samples.jsonl")
