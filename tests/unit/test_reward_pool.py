"""Rewards by import path: TRL's calling convention, and the worker pool that survives hostile rewards.

The reward functions are a real module written to a temporary working directory (the run's working directory is
where a user's module is found); the pool runs them in real worker processes.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from rewards import RewardsConfig, Sample, TrainingProgress, setup_rewards
from rewards.pool import RewardImportError

MODULE = '''
import asyncio, json, os, time

def record(prompts, completions, log_to, **kwargs):
    """Writes what it was called with (one JSON line per call) and scores each completion by its length."""
    kwargs["log_metric"]("calls", 1)
    state = kwargs.pop("trainer_state")
    for name in ("log_metric", "log_extra"):
        kwargs[name] = callable(kwargs[name])
    with open(log_to, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "prompts": prompts, "completions": completions,
                            "state": [state.global_step, state.max_steps] if state else None, **kwargs}) + "\\n")
    print("a stray print must not break the pool")
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]

async def maybe(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [None if "skip" in c[0]["content"] else 0.5 for c in completions]

def raises(prompts, completions, **kwargs):
    raise ValueError("scorer bug")

def sleeps(prompts, completions, **kwargs):
    time.sleep(10**6)

def exits(prompts, completions, **kwargs):
    os._exit(3)

def eats(prompts, completions, **kwargs):
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))

def wrong_length(prompts, completions, **kwargs):
    return [1.0]

def not_numbers(prompts, completions, **kwargs):
    return ["high"] * len(completions)

def infinite(prompts, completions, **kwargs):
    return [float("inf")] * len(completions)

def ok(prompts, completions, **kwargs):
    return [1.0] * len(completions)
'''


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working directory holding the user's module `user_rewards`, as a run's would."""
    (tmp_path / "user_rewards.py").write_text(MODULE)
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('module fails at import')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def rewards(*terms: dict, **cfg):
    return setup_rewards(RewardsConfig(terms=list(terms), **cfg))


def samples(texts: list[str], chat: bool = False) -> list[Sample]:
    raw = (lambda i: [{"role": "user", "content": f"q{i}"}]) if chat else (lambda i: f"q{i}")
    return [Sample(f"rendered q{i}", text, {"answer": str(i), "level": i % 2}, (i, i + 1), raw(i))
            for i, text in enumerate(texts)]


def calls(log: Path) -> list[dict]:
    """The recorded calls in batch order (workers run them in parallel, so they finish in any order)."""
    return sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda c: c["completion_ids"])


def test_a_plain_text_batch_gets_trls_arguments_in_a_worker_process(workdir) -> None:
    log = workdir / "calls.jsonl"
    with rewards({"fn": "user_rewards:record", "params": {"log_to": str(log)}, "weight": 2.0}) as rs:
        result = rs.score(samples(["a", "bb", "ccc", "dddd"]), [2, 2], TrainingProgress(4, 10))
    assert result.per_name == {"record": [1.0, 2.0, 3.0, 4.0]} and result.totals == [2.0, 4.0, 6.0, 8.0]
    first, second = calls(log)
    assert first["pid"] != os.getpid(), "a user's reward ran in the driver"
    assert first["prompts"] == ["q0", "q1"], "TRL's `prompts` are the rows' own prompts, one per completion"
    assert first["completions"] == ["a", "bb"] and second["completions"] == ["ccc", "dddd"], "one call per group"
    assert first["completion_ids"] == [[0, 1], [1, 2]]
    assert first["answer"] == ["0", "1"] and first["level"] == [0, 1], "columns arrive as keyword lists"
    assert first["state"] == [4, 10] and first["log_metric"] and first["log_extra"]
    assert result.logged_means == {"record/calls": 1.0} and result.errors == []


def test_a_conversational_batch_gets_message_lists_and_none_is_left_out(workdir) -> None:
    log = workdir / "calls.jsonl"
    terms = ({"fn": "user_rewards:record", "params": {"log_to": str(log)}}, {"fn": "user_rewards:maybe"})
    with rewards(*terms) as rs:
        result = rs.score(samples(["x", "skip"], chat=True))  # no group sizes: the batch is one call
    (call,) = calls(log)
    assert call["prompts"] == [[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}]]
    assert call["completions"] == [[{"role": "assistant", "content": text}] for text in ("x", "skip")]
    assert result.per_name["maybe"][0] == 0.5 and math.isnan(result.per_name["maybe"][1]), "async, and None kept"
    assert result.totals == [1.5, 4.0], "a None is left out of the weighted sum, as TRL's nansum does"
    assert result.means() == {"record": 2.5, "maybe": 0.5}


HOSTILE = ["raises", "sleeps", "exits", "eats"]


def test_hostile_rewards_fail_their_calls_while_scoring_goes_on(workdir) -> None:
    terms = [{"fn": f"user_rewards:{name}"} for name in HOSTILE] + [{"fn": "user_rewards:ok"}, {"name": "format"}]
    good = "<think>t</think><answer>1</answer>"
    with rewards(*terms, pool={"workers": 2, "timeout_s": 3, "memory_mb": 512}) as rs:
        pids = {w.proc.pid for w in rs.pool._workers}
        for _ in range(2):  # the pool is whole again after each batch: the second one fails the same way
            result = rs.score(samples([good, good, good]), [2, 1])
            assert result.per_name["ok"] == [1.0] * 3 and result.per_name["format"] == [1.0] * 3
            assert all(result.per_name[name] == [0.0] * 3 for name in HOSTILE)
            assert result.totals == [2.0] * 3
            assert result.failures == {"raised": 2, "invalid": 0, "timeout": 2, "crash": 2, "memory": 2}
            assert len(result.errors) == 8
        lines = "\n".join(result.errors)
        assert "reward raises failed (raised) on samples 0-1: ValueError('scorer bug')" in lines
        assert "reward sleeps failed (timeout) on samples 2-2: no answer within 3 s" in lines
        assert "reward exits failed (crash) on samples 0-1: worker process exited with code 3" in lines
        assert "reward eats failed (memory)" in lines and "memory_mb" in lines
        assert pids.isdisjoint(w.proc.pid for w in rs.pool._workers), "dead workers must have been replaced"
        live = [w.proc for w in rs.pool._workers]
        assert all(proc.poll() is None for proc in live)
    assert all(proc.poll() is not None for proc in live), "closing the set must end its workers"


@pytest.mark.parametrize("name, message", [
    ("wrong_length", "returned 1 values for 2 completions"),
    ("not_numbers", "value 0 is str 'high', not a number or None"),
    ("infinite", "value 0 is inf"),
])
def test_a_reward_that_returns_no_list_of_numbers_fails_as_invalid(workdir, name, message) -> None:
    with rewards({"fn": f"user_rewards:{name}"}) as rs:
        result = rs.score(samples(["a", "b"]))
    assert result.failures["invalid"] == 1 and message in result.errors[0]


def test_on_error_fail_stops_the_step_with_the_line(workdir) -> None:
    with rewards({"fn": "user_rewards:exits"}, on_error="fail") as rs:
        with pytest.raises(RuntimeError, match=r"reward exits failed \(crash\) on samples 0-0"):
            rs.score(samples(["a"]))


@pytest.mark.parametrize("fn, match", [
    ("no_such_module:f", r"rewards.terms\[1\].fn no_such_module:f: cannot load it: ModuleNotFoundError"),
    ("user_rewards:missing", r"AttributeError.*missing"),
    ("broken_rewards:f", r"RuntimeError\('module fails at import'\)"),
])
def test_a_reward_that_does_not_load_is_one_config_line(workdir, fn, match) -> None:
    with pytest.raises(RewardImportError, match=match) as info:
        rewards({"name": "format"}, {"fn": fn})
    assert "\n" not in str(info.value) and "working directory" in str(info.value)


def test_fn_terms_are_checked_when_the_config_loads() -> None:
    cfg = RewardsConfig(terms=[{"fn": "pkg.mod:score"}, {"fn": "pkg.mod:score", "name": "again"}],
                        solved_by="score")
    assert [t.label for t in cfg.terms] == ["score", "again"]
    for terms, match in [
        ([{"fn": "pkg.mod.score"}], "is not an import path like package.module:function"),
        ([{"fn": "m:f", "params": {"completions": 1}}], r"params \['completions'\] are arguments aha passes"),
        ([{"fn": "m:f"}, {"fn": "n:f"}], "reward 'f' appears 2 times"),
        ([{"fn": "m:errors"}], "taken by the reward/errors metric"),
        ([{"weight": 2.0}], "needs `name` .* or `fn`"),
    ]:
        with pytest.raises(ValidationError, match=match):
            RewardsConfig(terms=terms)
    with pytest.raises(ValidationError, match="solved_by 'nope' is not one of the terms"):
        RewardsConfig(terms=[{"name": "format"}], solved_by="nope")


def test_a_set_with_a_pool_does_not_pickle_and_close_is_idempotent(workdir) -> None:
    rs = rewards({"fn": "user_rewards:ok"})
    with pytest.raises(TypeError, match="owns worker processes"):
        pickle.dumps(rs)
    rs.close()
    rs.close()


DRIVER = """
import sys, time
from rewards import RewardsConfig, Sample, setup_rewards
rs = setup_rewards(RewardsConfig(terms=[{"fn": "user_rewards:sleeps"}], pool={"workers": 1, "timeout_s": 1000}))
print(rs.pool._workers[0].proc.pid, flush=True)
rs.score([Sample("p", "c")])
"""


def test_workers_die_with_a_killed_driver(workdir) -> None:
    """A driver killed with SIGKILL runs no cleanup; the kernel (PR_SET_PDEATHSIG) must end its hung worker."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DRIVER)], cwd=workdir, env=env,
                              stdout=subprocess.PIPE, text=True)
    worker = int(driver.stdout.readline())
    time.sleep(1)  # let the call reach the worker
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.2)
    assert not _alive(worker), f"worker {worker} outlived its killed driver"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
