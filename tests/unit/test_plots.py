"""Run plots: the reward figure gains a held-out eval panel exactly when the run logged in-loop evals."""

from __future__ import annotations

from orchestration.report.plots import write_plots


def _rows(with_eval: bool) -> list[dict]:
    rows = []
    for step in range(1, 7):
        row = {"step": step, "reward/total": 0.1 * step, "rollout/completion_len_mean": 50.0,
               "rollout/truncated_frac": 0.0}
        if with_eval and step % 3 == 0:
            row.update({"eval/accuracy": 0.2, "eval/accuracy_low": 0.1, "eval/accuracy_high": 0.3,
                        "eval/pass@4": 0.5, "eval/pass@4_low": 0.3, "eval/pass@4_high": 0.7})
        rows.append(row)
    return rows


def test_reward_plot_has_an_eval_panel_only_with_eval_rows(tmp_path):
    import matplotlib.image

    heights = {}
    for with_eval in (False, True):
        reward_png, length_png = write_plots(_rows(with_eval), tmp_path / str(with_eval))
        assert length_png.exists()
        heights[with_eval] = matplotlib.image.imread(reward_png).shape[0]
    assert heights[True] > 1.4 * heights[False], f"no eval panel under the reward plot: heights {heights}"
