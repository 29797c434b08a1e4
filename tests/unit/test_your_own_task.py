"""docs/your_own_task.md: the page shows the shipped files as they are, and its example loads and scores."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from orchestration.config.files import load_config
from rewards import Sample, setup_rewards
from tasks import setup_dataset

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "your_own_task.md"
CONFIG = ROOT / "configs" / "your_own_task_smollm2_cpu.yaml"
EXAMPLE = ROOT / "examples" / "your_own_task"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_shows_the_shipped_files() -> None:
    (data,), (code,), yaml = blocks("json"), blocks("python"), blocks("yaml")
    assert (EXAMPLE / "questions.jsonl").read_text().startswith(data), "the page's rows are not the file's first rows"
    assert code in (EXAMPLE / "my_rewards.py").read_text(), "the page's reward code is not my_rewards.py"
    assert yaml[0] in CONFIG.read_text(), "the page's config is not configs/your_own_task_smollm2_cpu.yaml"


def test_the_example_loads_and_scores(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the page runs it from the repository root: the reward module is found from there
    cfg = load_config(CONFIG)
    train, held_out = setup_dataset(cfg.data, "train"), setup_dataset(cfg.data, "eval")
    assert len(train) + len(held_out) == 64 and 8 <= len(held_out) <= 24
    prompt = train[0]
    assert prompt.messages[0] == {"role": "system", "content": "Reply with the number only."}
    answer = prompt.reference["answer"]
    replies = [answer, f"The answer is {answer}.", "12345", "I am not sure, but it may be " * 3 + answer]
    samples = [Sample(prompt.messages[-1]["content"], reply, prompt.reference, (), prompt.as_data) for reply in replies]
    with setup_rewards(cfg.rewards) as rewards:
        result = rewards.score(samples, [len(samples)])
    assert result.errors == []
    assert result.per_name["correct_answer"] == [1.0, 1.0, 0.0, 1.0]
    assert result.per_name["brevity"][0] == 0.0 and result.per_name["brevity"][3] == -1.0
    assert rewards.solved_by == "correct_answer"


def test_a_reward_that_does_not_import_stops_training_in_one_line(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestration.cli.train", "--config", str(CONFIG), "--run-dir", str(tmp_path / "run"),
         'rewards.terms=[{fn: "my_missing_module:score"}]', "rewards.solved_by=null"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("config error: ")]
    assert len(errors) == 1 and "rewards.terms[0].fn my_missing_module:score: cannot load it" in errors[0]
    assert "Ray" not in (tmp_path / "run" / "train.log").read_text(), "the cluster was started before the check"


def test_the_eval_cli_draws_the_held_out_rows(monkeypatch) -> None:
    """`python -m orchestration.cli.eval CONFIG --limit 16` (the page's eval) resolves to held-out rows only; another
    --seed draws them in another order, never training rows."""
    from orchestration.cli.eval import parse_args, resolve

    monkeypatch.chdir(ROOT)
    train = {p.uid.rsplit("-", 1)[1] for p in setup_dataset(load_config(CONFIG).data, "train")}
    uids = {}
    for seed in (0, 1):
        job = resolve(parse_args([str(CONFIG), "--limit", "16", "--seed", str(seed)]))
        uids[seed] = [p.uid.rsplit("-", 1)[1] for p in job.prompts]
        assert len(uids[seed]) == 16 and not train & set(uids[seed])
    assert uids[0] != uids[1]
