"""The quick tier's one end-to-end pass (`bash scripts/test.sh --quick`): each entry point a user runs first, once,
on the tiny model, through the real CLI, engine, learner and Ray: a run SIGKILLed after its second step, its resume
for a third, the trained adapter served for one request, and one Tinker forward_backward on the official SDK.

Each entry point ends here by SIGKILL (the OOM killer's, a scheduler's hard stop, a test's timeout), which no handler
sees: nothing it started may outlive it by more than conftest's SIGKILL_CLEANUP_S (orchestration/cluster/reaper.py;
on main at 98997ee `aha train` and `aha tinker` SIGKILLed left Ray's dashboard and runtime-env agents, or the engine,
running for 5 s to minutes). The full suite holds each entry point in depth (test_train_e2e.py, test_tinker_service.py) and runs
this module too.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import MARK, assert_nothing_outlives
from orchestration.metrics import read_metrics
from test_signals_outside import WAIT_S, wait_for
from test_train_e2e import CONFIG, ROOT, TINY, assert_finite_rows, clean_env, run_train, serve_and_ask, train_cmd
from tinker_server import start, stop

pytestmark = pytest.mark.integration

# What `aha train` prints on stdout without --verbose (orchestration/console.py): nothing else, no timestamps.
CONSOLE_LINES = [re.compile(p) for p in (
    r"step \d+/\d+ \| reward .*",
    r"eval at step \d+ \| accuracy .*",
    r"checkpoint saved at step \d+",
    r"resumed at step \d+ \(adapter policy-v\d+ served; LoRA sha256 \w+\)",
    r"logs: \S+/train\.log \(this process\), \S+/ray-logs/ \(Ray: learner, engines\)",
    r"serve the trained adapter: aha serve \S+",
)]


def stray_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if not any(p.fullmatch(line) for p in CONSOLE_LINES)]


def test_train_killed_resumed_and_served(tmp_path: Path, tiny_model_dir) -> None:
    """Two steps saved, SIGKILL while the third generates (held there: orchestration/faults.py), nothing left
    running; --resume finishes the third, printing only the console's lines (fails on main at 99aeed4, which
    printed the whole log); the adapter served, and serve SIGKILLed leaves nothing either."""
    run_dir, held, marker = tmp_path / "run", tmp_path / "held", uuid.uuid4().hex
    env = clean_env() | {"AHA_FAULT": "generate:hold@3", "AHA_FAULT_HELD": str(held), MARK: marker}
    args = ["--config", str(CONFIG), "--run-dir", str(run_dir), *TINY, "train.steps=3", "train.save_every=1"]
    with open(tmp_path / "first.log", "w") as out:
        proc = subprocess.Popen(train_cmd(*args), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for(held, proc, tmp_path / "first.log", WAIT_S)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_nothing_outlives(marker, "aha train")
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2]

    resumed = run_train(["--resume", str(run_dir)])
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3], resumed.stdout[-3000:]
    assert_finite_rows(rows)
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists(), "no final PEFT adapter"
    # The resumed run's console: its lines only (on main at 99aeed4 every INFO line with a timestamp and logger,
    # Ray's, JAX's and orbax's lines forwarded from the learner); the rest in the files the closing lines name.
    assert not stray_lines(resumed.stdout), f"lines outside the console's forms:\n{resumed.stdout[-3000:]}"
    assert "step 3/3 | reward" in resumed.stdout and "checkpoint saved at step 3" in resumed.stdout, resumed.stdout
    assert "resumed at step 2" in (run_dir / "train.log").read_text(), "the full log is not in train.log"
    assert any((run_dir / "ray-logs").glob("worker-*.err")), "ray-logs/ holds no worker output"
    serve_and_ask(run_dir, sig=signal.SIGKILL)


def test_one_tinker_forward_backward(tmp_path: Path, tiny_model_dir) -> None:
    """The official SDK's first calls against `aha tinker`; the server SIGKILLed (its process, not its group) leaves
    nothing running."""
    from tinker import types

    marker = uuid.uuid4().hex
    server = start(tmp_path / "tinker", "model.path=tiny-llama", "rollout.backend.max_lora_rank=16",
                   env={MARK: marker})
    try:
        training = server.client().create_lora_training_client(base_model="tiny-llama", rank=8, seed=0).result()
        tokens = list(range(40, 60))
        datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
        out = training.forward_backward([datum], "cross_entropy").result()
        loss = out.metrics["loss:sum"]
        assert math.isfinite(loss) and loss > 0, out.metrics
        assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == len(tokens) - 1
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        for client in server.clients:  # its session ends first: the SDK's heartbeat thread would outlive the server
            client.close("success").result(timeout=10)
        server.clients.clear()
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=60)
        assert_nothing_outlives(marker, "aha tinker")
    finally:
        stop(server)
