"""PNG plots of a run from its metrics rows: reward (total and per reward function) and completion length per step."""

from __future__ import annotations

from pathlib import Path


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pts], [v for _, v in pts]


def write_plots(rows: list[dict], out_dir: Path) -> list[Path]:
    """Write reward.png and length.png into out_dir; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    reward_keys = sorted({k for r in rows for k in r if k.startswith("reward/")} - {"reward/total_std", "reward/errors"})
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in reward_keys:
        steps, vals = _series(rows, key)
        ax.plot(steps, vals, label=key.split("/", 1)[1], linewidth=2.5 if key == "reward/total" else 1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title("reward per step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    reward_png = out_dir / "reward.png"
    fig.savefig(reward_png, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    steps, vals = _series(rows, "rollout/completion_len_mean")
    ax.plot(steps, vals, label="mean completion length (tokens)")
    steps, vals = _series(rows, "rollout/truncated_frac")
    ax2 = ax.twinx()
    ax2.plot(steps, vals, color="tab:red", alpha=0.6, label="truncated fraction")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    ax2.set_ylabel("truncated fraction")
    ax.set_title("completion length per step")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    length_png = out_dir / "length.png"
    fig.savefig(length_png, dpi=110)
    plt.close(fig)
    return [reward_png, length_png]
