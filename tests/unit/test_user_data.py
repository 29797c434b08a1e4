"""`data.task: dataset`: the three file formats give the same prompts, the held-out split, seeded orders, exact resume
of the data position, and errors that name the file, the row and the fix. (Streaming: test_user_data_streaming.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks import DataConfig, DataError, PromptStream, setup_dataset

ROWS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "level": i % 3} for i in range(300)]
CHAT = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}."}],
         "answer": str(i)} for i in range(40)]


def write(rows: list[dict], path: Path, kind: str) -> Path:
    """`rows` as a JSONL file, a Parquet file (small row groups, so rows span several) or a save_to_disk folder."""
    if kind == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = path.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=17)
    else:
        import datasets

        datasets.Dataset.from_list(rows).save_to_disk(str(path), max_shard_size="20KB")  # several arrow files
    return path


def dataset(path: Path, **update) -> DataConfig:
    return DataConfig(task="dataset", path=str(path), **update)


@pytest.mark.parametrize("rows", [ROWS, CHAT], ids=["text", "messages"])
def test_jsonl_parquet_and_saved_folder_give_the_same_prompts(tmp_path, rows) -> None:
    splits = {}
    for kind in ("jsonl", "parquet", "saved"):
        cfg = dataset(write(rows, tmp_path / kind, kind), eval_fraction=0.2, system_prompt="Sys.")
        splits[kind] = [list(setup_dataset(cfg, split)) for split in ("train", "eval")]
    assert splits["jsonl"] == splits["parquet"] == splits["saved"]
    train, held_out = splits["jsonl"]
    assert len(train) + len(held_out) == len(rows)
    first = train[0]
    assert first.task == "dataset" and first.uid.startswith("dataset-train-")
    if "prompt" in rows[0]:
        assert first.messages == ({"role": "system", "content": "Sys."}, {"role": "user", "content": "What is 0 + 1?"})
        assert first.reference == {"answer": "1", "level": 0}, "every other column must reach the rewards"
        assert first.as_data == "What is 0 + 1?", "TRL's `prompts` is the row's own text"
    else:
        assert first.messages == tuple(rows[0]["messages"]), "a row's own system message is kept, not doubled"
        assert first.reference == {"answer": "0"} and first.as_data == rows[0]["messages"]


def test_base_template_keeps_the_text_and_prompt_field_maps_another_column(tmp_path) -> None:
    path = write([{"question": "2 + 2?", "answer": "4"}], tmp_path / "q", "jsonl")
    prompt = setup_dataset(dataset(path, prompt_field="question", template="base"), "train")[0]
    assert prompt.text == "2 + 2?" and prompt.messages is None and prompt.reference == {"answer": "4"}
    # TRL's conversational layout: the prompt column holds the messages.
    row = {"prompt": [{"role": "user", "content": "hi", "name": None}], "answer": "x"}
    path = write([row], tmp_path / "c", "jsonl")
    prompt = setup_dataset(dataset(path), "train")[0]
    assert prompt.messages == ({"role": "user", "content": "hi"},), "None-valued keys (Arrow struct fill) dropped"


def test_held_out_split_is_disjoint_seed_free_and_ordered_by_the_seed(tmp_path) -> None:
    path = write(ROWS, tmp_path / "d", "jsonl")
    cfg = dataset(path, eval_fraction=0.25, eval_size=1000)
    train = {p.uid.split("-")[-1] for p in setup_dataset(cfg, "train")}
    held = [p.uid.split("-")[-1] for p in setup_dataset(cfg, "eval")]
    assert not train & set(held) and len(train) + len(held) == len(ROWS)
    assert 0.15 * len(ROWS) < len(held) < 0.35 * len(ROWS), f"{len(held)} of {len(ROWS)} held out for 0.25"
    other = [p.uid.split("-")[-1] for p in setup_dataset(cfg.model_copy(update={"seed": 1}), "eval")]
    assert set(other) == set(held), "which rows are held out must not depend on the seed (eval --seed)"
    assert other != held, "the seed orders the held-out prompts"
    assert [p.uid for p in setup_dataset(cfg.model_copy(update={"eval_size": 5}), "eval")] == \
        [f"dataset-eval-{u}" for u in held[:5]]
    assert len(setup_dataset(cfg.model_copy(update={"train_size": 10}), "train")) == 10
    # A second file: train is all of path, eval all of eval_path.
    eval_path = write(ROWS[:7], tmp_path / "e", "parquet")
    cfg = dataset(path, eval_path=str(eval_path))
    assert len(setup_dataset(cfg, "train")) == len(ROWS) and len(setup_dataset(cfg, "eval")) == 7
    assert len(setup_dataset(dataset(path), "eval")) == 0, "no held-out rows unless asked for"


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved"])
def test_a_resumed_stream_draws_exactly_the_same_prompts(tmp_path, kind) -> None:
    cfg = dataset(write(ROWS, tmp_path / kind, kind), eval_fraction=0.1)
    stream = PromptStream(setup_dataset(cfg, "train"), batch_size=7, seed=3)
    for _ in range(50):  # past the first epoch (about 270 train rows)
        stream.next_batch()
    state = json.loads(json.dumps(stream.state_dict()))  # what a checkpoint stores
    expected = [[p.uid for p in stream.next_batch()] for _ in range(30)]
    resumed = PromptStream(setup_dataset(cfg, "train"), batch_size=7, seed=3)  # a new process opens the file anew
    resumed.load_state_dict(state)
    assert [[p.uid for p in resumed.next_batch()] for _ in range(30)] == expected
    assert state["epoch"] == 1 and state["source"].startswith(("jsonl:", "parquet:", "arrow:"))


def test_a_changed_file_refuses_the_old_data_position(tmp_path) -> None:
    path = write(ROWS, tmp_path / "d", "jsonl")
    state = PromptStream(setup_dataset(dataset(path), "train"), 4, seed=0).state_dict()
    write(ROWS[:-1] + [{"prompt": "changed", "answer": "0", "level": 0}], tmp_path / "d", "jsonl")
    with pytest.raises(ValueError, match="the data file changed since the checkpoint"):
        PromptStream(setup_dataset(dataset(path), "train"), 4, seed=0).load_state_dict(state)


def test_blank_lines_are_skipped_and_a_bad_row_names_its_line(tmp_path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a"}\r\n\r\n\n{"prompt": "b"}\n{"prompt": \n{"prompt": "d"}')
    prompts = setup_dataset(dataset(path), "train")
    assert len(prompts) == 4 and prompts[1].as_data == "b" and prompts[3].as_data == "d"
    with pytest.raises(DataError, match=r"d.jsonl:5: not valid JSON"):
        prompts[2]


@pytest.mark.parametrize("content, update, match", [
    ('{"question": "q"}', {}, r"no 'prompt' or 'messages' column \(columns: \['question'\]\); set data.prompt_field"),
    ('[1, 2]', {}, "expected a JSON object per line, got list"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}', {},
     "end with an assistant turn"),
    ('{"messages": [{"role": "user", "content": "q"}]}', {"template": "base"}, "set data.template: chat"),
    ('{"prompt": 7}', {}, "must be text or a non-empty list of chat messages, got int"),
])
def test_row_errors_say_what_to_fix(tmp_path, content, update, match) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content + "\n")
    with pytest.raises(DataError, match=match):
        setup_dataset(dataset(path, **update), "train")  # the first row is checked when the file is opened


def test_file_errors_say_what_to_fix(tmp_path) -> None:
    with pytest.raises(ValidationError, match="data.path is required when task is 'dataset'"):
        DataConfig(task="dataset")
    with pytest.raises(ValidationError, match="both hold out rows"):
        DataConfig(task="dataset", path="x.jsonl", eval_path="y.jsonl", eval_fraction=0.1)
    with pytest.raises(DataError, match="data.path: .*nope.jsonl not found"):
        setup_dataset(dataset(tmp_path / "nope.jsonl"), "train")
    (tmp_path / "d.csv").write_text("prompt\nhi\n")
    with pytest.raises(DataError, match="neither JSON Lines .* nor Parquet"):
        setup_dataset(dataset(tmp_path / "d.csv"), "train")
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:3]),
                          "test": datasets.Dataset.from_list(ROWS[3:5])}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"holds several splits \['test', 'train'\]; point data.path at one"):
        setup_dataset(dataset(tmp_path / "dd"), "train")
    assert len(setup_dataset(dataset(tmp_path / "dd" / "test"), "train")) == 2
    with pytest.raises(DataError, match="no training rows left"):
        setup_dataset(dataset(write(ROWS[:1], tmp_path / "one", "jsonl"), eval_fraction=0.99), "train")


def test_eval_needs_held_out_rows(tmp_path) -> None:
    from orchestration.config.errors import ConfigError
    from orchestration.config.files import load_config

    with pytest.raises(ConfigError, match="eval.every needs held-out rows: set data.eval_fraction"):
        load_config(Path(__file__).resolve().parents[2] / "configs" / "your_own_task_smollm2_cpu.yaml",
                    ["data.eval_fraction=0.0"])
