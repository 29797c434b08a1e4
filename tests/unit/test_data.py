"""Task data: deterministic generators, disjoint splits, solvable puzzles, GSM8K loading, exact stream resume."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tasks import DataConfig, Prompt, PromptStream, setup_dataset
from rewards import countdown, format, math_answer


def _key(prompt: Prompt) -> str:
    ref = prompt.reference
    if prompt.task == "countdown":
        return repr((sorted(ref["numbers"]), ref["target"]))
    return prompt.messages[1]["content"]


@pytest.mark.parametrize("task", ["countdown", "math"])
def test_generators_are_deterministic_and_splits_disjoint(task: str) -> None:
    cfg = DataConfig(task=task, train_size=3000, eval_size=300, seed=7)
    train, evals = setup_dataset(cfg, "train"), setup_dataset(cfg, "eval")
    assert len(train) == 3000 and len(evals) == 300
    assert setup_dataset(cfg, "train") == train, "same config must give the same prompts"
    assert setup_dataset(cfg.model_copy(update={"seed": 8}), "train") != train
    train_keys, eval_keys = {_key(p) for p in train}, {_key(p) for p in evals}
    assert len(train_keys) == len(train) and len(eval_keys) == len(evals), "duplicate prompts within a split"
    assert not train_keys & eval_keys, "train and eval overlap"
    # Membership is by content, so a bigger eval split keeps the smaller one's items and stays disjoint.
    bigger = setup_dataset(cfg.model_copy(update={"eval_size": 600}), "eval")
    assert {_key(p) for p in bigger} >= eval_keys and not {_key(p) for p in bigger} & train_keys
    assert len({p.uid for p in train + evals}) == len(train) + len(evals)
    assert train[5].uid == f"{task}-train-000005"


def test_every_countdown_puzzle_is_solved_by_its_solution() -> None:
    cfg = DataConfig(countdown_numbers=(3, 4), max_number=100, max_target=100)
    prompts = setup_dataset(cfg, "train") + setup_dataset(cfg, "eval")
    counts = set()
    for prompt in prompts:
        ref = prompt.reference
        counts.add(len(ref["numbers"]))
        assert all(1 <= n <= 100 for n in ref["numbers"]) and 1 <= ref["target"] <= 100
        completion = f"<think>easy</think>\n<answer>{ref['solution']}</answer>"
        assert countdown.score(completion, ref["numbers"], ref["target"]) == 1.0, f"{prompt.uid} unsolved: {ref}"
        assert str(ref["numbers"]) in prompt.messages[1]["content"]
    assert counts == {3, 4}


def test_countdown_knobs() -> None:
    cfg = DataConfig(countdown_numbers=(5, 6), max_number=20, max_target=500, train_size=200, eval_size=10)
    for prompt in setup_dataset(cfg, "train"):
        ref = prompt.reference
        assert 5 <= len(ref["numbers"]) <= 6 and max(ref["numbers"]) <= 20 and ref["target"] <= 500
        assert countdown.score(f"<answer>{ref['solution']}</answer>", ref["numbers"], ref["target"]) == 1.0


def test_math_generator_answers_are_exact_integers() -> None:
    for prompt in setup_dataset(DataConfig(task="math", train_size=500), "train"):
        answer = prompt.reference["answer"]
        assert answer.isdigit(), prompt
        assert math_answer.score(f"<think>x</think><answer>{answer}</answer>", answer) == 1.0


def test_templates() -> None:
    chat = setup_dataset(DataConfig(train_size=2), "train")[0]
    system, user = chat.messages
    assert chat.text is None and system["role"] == "system" and user["role"] == "user"
    assert "<think> </think>" in system["content"] and "<answer> </answer>" in system["content"]
    assert "exactly once" in user["content"]
    # Nothing a small model can copy as its thinking or its answer (an earlier demo converged to exactly that).
    assert "..." not in system["content"] + user["content"] and "e.g." not in user["content"]
    base = setup_dataset(DataConfig(template="base", train_size=2), "train")[0]
    assert base.messages is None and base.text.endswith("Assistant: Let me solve this step by step.\n<think>")
    assert base.reference == chat.reference
    # A base-model completion starts inside the think block the prompt opened: full format credit.
    assert format.score("reasoning</think>\n<answer>1 + 2</answer>") == 1.0
    math = setup_dataset(DataConfig(task="math", train_size=1), "train")[0]
    assert "final number in <answer> </answer>" in math.messages[1]["content"]


def _write_gsm8k(path, n: int) -> None:
    rows = [
        {"question": f"Q{i}: what is {i} + 1000?", "answer": f"{i} + 1000 = <<{i}+1000={i + 1000}>>\n#### {i + 1000:,}"}
        for i in range(n)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")


def test_gsm8k_loader_holds_out_eval(tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    _write_gsm8k(path, 50)
    cfg = DataConfig(task="gsm8k", gsm8k_path=str(path), train_size=1000, eval_size=10, template="base")
    train, evals = setup_dataset(cfg, "train"), setup_dataset(cfg, "eval")
    assert len(train) == 40 and len(evals) == 10
    assert train[0].task == "math" and train[0].reference == {"answer": "1000"}  # comma removed
    assert evals[0].reference == {"answer": "1040"} and "Q40:" in evals[0].text
    assert train[0].uid == "math-train-000000"
    eval_path = tmp_path / "test.jsonl"
    _write_gsm8k(eval_path, 5)
    cfg = cfg.model_copy(update={"gsm8k_eval_path": str(eval_path), "train_size": 30})
    assert len(setup_dataset(cfg, "train")) == 30 and len(setup_dataset(cfg, "eval")) == 5


def test_gsm8k_errors_say_what_to_fix(tmp_path) -> None:
    with pytest.raises(ValidationError, match="data.gsm8k_path is required"):
        DataConfig(task="gsm8k")
    with pytest.raises(ValueError, match="not found; set data.gsm8k_path"):
        setup_dataset(DataConfig(task="gsm8k", gsm8k_path=str(tmp_path / "nope.jsonl")), "train")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object with question/answer"):
        setup_dataset(DataConfig(task="gsm8k", gsm8k_path=str(bad)), "train")
    bad.write_text('{"question": "q", "answer": "42"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: answer has no '#### N'"):
        setup_dataset(DataConfig(task="gsm8k", gsm8k_path=str(bad)), "train")


@pytest.mark.parametrize(
    "update, match",
    [({"countdown_numbers": (1, 3)}, "2 <= min <= max <= 6"), ({"train_size": 0}, "train_size"), ({"foo": 1}, "foo")],
)
def test_bad_config(update: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        DataConfig(**update)


def test_impossible_size_says_what_to_change() -> None:
    with pytest.raises(ValueError, match=r"set data.train_size to at most \d+ or widen the generator"):
        setup_dataset(DataConfig(countdown_numbers=(2, 2), max_number=2, max_target=4, train_size=50), "train")


def test_a_training_run_with_too_few_puzzles_stops_in_one_line_before_any_cluster(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # The config's generator holds ~2.6k distinct train puzzles: 3000 is too many, and its budget of draws (50 per
    # item asked) is a third of what 9000 cost.
    proc = subprocess.run(
        [sys.executable, "-m", "orchestration.cli.train", "--config", str(root / "configs" / "countdown_smollm2_cpu.yaml"),
         "--run-dir", str(tmp_path / "run"), "data.train_size=3000"],
        cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("config error: ")]
    assert len(errors) == 1 and "set data.train_size to at most" in errors[0], proc.stderr[-2000:]
    assert "Ray" not in (tmp_path / "run" / "train.log").read_text(), "the cluster was started before the data check"


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(f"p{i}", "countdown", None, f"text {i}", {"numbers": [i], "target": i}) for i in range(n)]


def test_stream_covers_each_epoch_once_and_reshuffles() -> None:
    stream = PromptStream(_prompts(12), batch_size=4, seed=0)
    epochs = [[p.uid for _ in range(3) for p in stream.next_batch()] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(f"p{i}" for i in range(12))
    assert epochs[0] != epochs[1], "each epoch should be reshuffled"
    assert stream.epoch == 1
    other = PromptStream(_prompts(12), batch_size=4, seed=1)
    assert [p.uid for p in other.next_batch()] != epochs[0][:4]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 30), batch_size=st.integers(1, 40), before=st.integers(0, 20), after=st.integers(1, 20))
def test_stream_resumes_exactly(n: int, batch_size: int, before: int, after: int) -> None:
    stream = PromptStream(_prompts(n), batch_size, seed=3)
    for _ in range(before):
        stream.next_batch()
    state = json.loads(json.dumps(stream.state_dict()))  # what a checkpoint stores
    expected = [stream.next_batch() for _ in range(after)]
    resumed = PromptStream(_prompts(n), batch_size, seed=3)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(after)] == expected
    assert all(len(batch) == batch_size for batch in expected)


def test_stream_rejects_foreign_state() -> None:
    state = PromptStream(_prompts(10), 2, seed=0).state_dict()
    with pytest.raises(ValueError, match="stream state is for 10 prompts with seed 0"):
        PromptStream(_prompts(11), 2, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="at least one prompt"):
        PromptStream([], 2, seed=0)


def test_rewards_read_the_assistant_prefix_with_the_completion(tiny_model_dir) -> None:
    """With `assistant_prefix: "<answer>"` the completion holds only `EQUATION</answer>`: scored alone it has no
    answer block; the turn as the reader sees it (prefix + completion) has one."""
    import dataclasses

    from tasks.render import PromptRenderer
    from rewards.types import Sample

    prompt = setup_dataset(DataConfig(task="countdown", train_size=50, eval_size=0), "train")[0]
    completion = f"{prompt.reference['solution']}</answer>"
    renderer = PromptRenderer(tiny_model_dir, "<answer>")
    assert renderer.text(prompt).endswith("<answer>")
    turn = renderer.turn(prompt, completion)
    assert turn == "<answer>" + completion
    reward = countdown.CountdownReward()
    assert reward(Sample(renderer.text(prompt), completion, prompt.reference)) == 0.0
    assert reward(Sample(renderer.text(prompt), turn, prompt.reference)) == 1.0
    assert format.score(turn) == format.ANSWER_ONLY_SCORE
    base = dataclasses.replace(prompt, messages=None, text="plain prompt")
    assert renderer.turn(base, completion) == completion, "a base-template prompt gets no chat prefix"


def test_the_system_prompt_is_the_configs_when_set() -> None:
    default = setup_dataset(DataConfig(train_size=5, eval_size=0), "train")[0]
    own = setup_dataset(DataConfig(train_size=5, eval_size=0, system_prompt="Reply with the equation."), "train")[0]
    assert own.messages[0] == {"role": "system", "content": "Reply with the equation."}
    assert own.messages[1] == default.messages[1] and default.messages[0]["content"] != own.messages[0]["content"]
