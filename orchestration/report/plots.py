"""PNG plots: a run's reward, held-out eval accuracy and completion length per step; base vs trained from an eval."""

from __future__ import annotations

from pathlib import Path


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pts], [v for _, v in pts]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    return plt


def write_plots(rows: list[dict], out_dir: Path) -> list[Path]:
    """Write reward.png (with a held-out eval panel when the run has eval rows) and length.png; returns the paths."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    has_eval = any("eval/accuracy" in r for r in rows)
    fig, axes = plt.subplots(2 if has_eval else 1, 1, figsize=(7, 6.5 if has_eval else 4), sharex=True, squeeze=False)
    _plot_rewards(axes[0][0], rows)
    if has_eval:
        _plot_eval(axes[1][0], rows)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    reward_png = out_dir / "reward.png"
    fig.savefig(reward_png, dpi=110)
    plt.close(fig)
    length_png = out_dir / "length.png"
    _plot_length(plt, rows, length_png)
    return [reward_png, length_png]


def _plot_rewards(ax, rows: list[dict]) -> None:
    reward_keys = sorted({k for r in rows for k in r if k.startswith("reward/") and not k.startswith("reward/errors")}
                         - {"reward/total_std"})  # failure counts are no rewards
    for key in reward_keys:
        steps, vals = _series(rows, key)
        ax.plot(steps, vals, label=key.split("/", 1)[1], linewidth=2.5 if key == "reward/total" else 1.2)
    ax.set_ylabel("mean reward")
    ax.set_title("train reward per step")
    ax.grid(alpha=0.3)
    ax.legend()


def _plot_eval(ax, rows: list[dict]) -> None:
    """Held-out accuracy and pass@k per eval step, Wilson 95% intervals as error bars."""
    keys = ["eval/accuracy"] + sorted({k for r in rows for k in r if k.startswith("eval/pass@") and "_" not in k})
    for key in keys:
        steps, vals = _series(rows, key)
        low = [r[f"{key}_low"] for r in rows if isinstance(r.get(key), (int, float))]
        high = [r[f"{key}_high"] for r in rows if isinstance(r.get(key), (int, float))]
        err = [[v - lo for v, lo in zip(vals, low)], [hi - v for v, hi in zip(vals, high)]]
        ax.errorbar(steps, vals, yerr=err, marker="o", capsize=3, label=key.split("/", 1)[1])
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("held-out")
    ax.set_title("held-out eval per step (95% Wilson intervals)")
    ax.grid(alpha=0.3)
    ax.legend()


def _plot_length(plt, rows: list[dict], path: Path) -> None:
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_eval_plot(report: dict, path: Path) -> Path:
    """Grouped bars per metric (accuracy, pass@k, mean reward): base vs trained, 95% intervals as error bars."""
    plt = _pyplot()
    phases = [p for p in ("base", "trained") if p in report]
    metrics = [k for k, v in report[phases[0]].items() if isinstance(v, dict) and "low" in v]
    fig, ax = plt.subplots(figsize=(max(5, 2 * len(metrics) + 1), 4))
    width = 0.8 / len(phases)
    for i, phase in enumerate(phases):
        vals = [report[phase][m]["value"] for m in metrics]
        err = [[v - report[phase][m]["low"] for v, m in zip(vals, metrics)],
               [report[phase][m]["high"] - v for v, m in zip(vals, metrics)]]
        xs = [j + (i - (len(phases) - 1) / 2) * width for j in range(len(metrics))]
        ax.bar(xs, vals, width, yerr=err, capsize=4, label=phase)
        for x, v in zip(xs, vals):
            # At the bar's foot: above the top it would sit under the error bar.
            ax.annotate(f"{v:.2f}", (x, 0), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    labels = metrics
    if "difference" in report:
        d = report["difference"]
        labels = [f"{m}\n{d[m]['value']:+.3f} [{d[m]['low']:+.3f}, {d[m]['high']:+.3f}]" if m in d else m
                  for m in metrics]
    ax.set_xticks(range(len(metrics)), labels, fontsize=8)
    ax.set_title(f"{report['task']}: {report['prompts']} held-out prompts x {report['k']} samples (95% CI)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
