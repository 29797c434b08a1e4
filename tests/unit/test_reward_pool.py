"""Rewards by import path: TRL's calling convention, and the worker pool that survives hostile rewards.

The reward functions are a real module written to a temporary working directory (the run's working directory is
where a user's module is found); the pool runs them in real worker processes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import pwd
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

import hostile_reward_source
from rewards import RewardsConfig, Sample, TrainingProgress, setup_rewards
from rewards.config import RewardPoolConfig
from rewards.containment import TOKEN_VAR, members
from rewards.pool import Call, RewardImportError, RewardPool
from rewards.worker_log import MAX_BYTES_PER_CALL

MODULE = '''
import asyncio, json, os, signal, sys, time

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

def sleeps(prompts, completions, **kwargs):
    time.sleep(10**6)

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

def segfault(prompts, completions, **kwargs):
    import ctypes
    ctypes.string_at(0)

def huge_reply(prompts, completions, **kwargs):
    from multiprocessing.connection import Connection
    Connection(int(sys.argv[1])).send_bytes(b"[" * (65 << 20))  # into the worker's pipe, past its own checks
    return [1.0] * len(completions)

def floods_stderr(prompts, completions, **kwargs):
    line = "x" * 1023 + "\\n"
    for _ in range(100 * 1024):  # 100 MiB
        sys.stderr.write(line)
    sys.stderr.write("y" * (8 << 20))  # and a line of 8 MiB
    sys.stderr.flush()
    return [1.0] * len(completions)

def daemon(prompts, completions, then="return", **kwargs):
    """Starts a grandchild in a session of its own (as a daemonising library does), which outlives its parent."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode())
            time.sleep(10**6)
        os._exit(0)
    pid = int(os.read(read, 32))
    os.wait()
    with open("out/daemon.pid", "w") as f:
        f.write(str(pid))
    if then == "exit":
        os._exit(3)
    if then == "sleep":
        time.sleep(10**6)
    return [float(pid)] * len(completions)

def escape(prompts, completions, **kwargs):
    """What a reward could do with the driver's privileges, 1.0 where it managed: raise its task limit, signal the
    driver, write the working directory."""
    import resource
    done = []
    for attempt in (lambda: resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY,) * 2),
                    lambda: os.kill(os.getppid(), 0), lambda: open("escaped", "w").close()):
        try:
            attempt()
            done.append(1.0)
        except (OSError, ValueError):
            done.append(0.0)
    return done

def lazy_imports(prompts, completions, **kwargs):
    """Submodules of packages the worker imported before it switched user (multiprocessing, zoneinfo via pydantic)."""
    import multiprocessing.pool, zoneinfo._common, json.tool
    return [1.0] * len(completions)

def limits(prompts, completions, **kwargs):
    import resource
    names = ("RLIMIT_DATA", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE")
    return [float(resource.getrlimit(getattr(resource, n))[1]) for n in names] + [float(os.getuid())]
''' + hostile_reward_source.HOSTILE


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working directory holding the user's module `user_rewards`, as a run's would."""
    (tmp_path / "user_rewards.py").write_text(MODULE)
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('module fails at import')\n")
    tmp_path.chmod(0o755)  # as root the workers run as nobody: they must read the module's folder (its parents not)
    (tmp_path / "out").mkdir(mode=0o777)  # ...and write only where they may: `out/...`, relative to their cwd
    (tmp_path / "out").chmod(0o777)
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
    log = workdir / "out" / "calls.jsonl"
    with rewards({"fn": "user_rewards:record", "params": {"log_to": "out/calls.jsonl"}, "weight": 2.0}) as rs:
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
    log = workdir / "out" / "calls.jsonl"
    terms = ({"fn": "user_rewards:record", "params": {"log_to": "out/calls.jsonl"}}, {"fn": "user_rewards:maybe"})
    with rewards(*terms) as rs:
        result = rs.score(samples(["x", "skip"], chat=True))  # no group sizes: the batch is one call
    (call,) = calls(log)
    assert call["prompts"] == [[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}]]
    assert call["completions"] == [[{"role": "assistant", "content": text}] for text in ("x", "skip")]
    assert result.per_name["maybe"][0] == 0.5 and math.isnan(result.per_name["maybe"][1]), "async, and None kept"
    assert result.totals == [1.5, 4.0], "a None is left out of the weighted sum, as TRL's nansum does"
    assert result.means() == {"record": 2.5, "maybe": 0.5}


HOSTILE = ["raises", "exits", "eats"]


def test_hostile_rewards_fail_their_calls_while_scoring_goes_on(workdir) -> None:
    """Rewards that raise, exit or eat memory fail their own calls; the others score on, twice over. (Rewards that
    never answer are the next test's: here nothing waits on a timeout, so the box's speed cannot change a result.)"""
    terms = [{"fn": f"user_rewards:{name}"} for name in HOSTILE] + [{"fn": "user_rewards:ok"}, {"name": "format"}]
    good = "<think>t</think><answer>1</answer>"
    with rewards(*terms, pool={"workers": 2, "memory_mb": 512}) as rs:
        pids = {w.proc.pid for w in rs.pool._workers}
        for _ in range(2):  # the pool is whole again after each batch: the second one fails the same way
            result = rs.score(samples([good, good, good]), [2, 1])
            assert result.per_name["ok"] == [1.0] * 3 and result.per_name["format"] == [1.0] * 3
            assert all(result.per_name[name] == [0.0] * 3 for name in HOSTILE)
            assert result.totals == [2.0] * 3
            assert result.failures == {"raised": 2, "invalid": 0, "timeout": 0, "crash": 2, "memory": 2}
            assert len(result.errors) == 6
        lines = "\n".join(result.errors)
        assert "reward raises failed (raised) on samples 0-1: ValueError('scorer bug')" in lines
        assert "reward exits failed (crash) on samples 0-1: worker process exited with code 3" in lines
        assert "reward eats failed (memory)" in lines and "memory_mb" in lines
        assert pids.isdisjoint(w.proc.pid for w in rs.pool._workers), "dead workers must have been replaced"
        live = [w.proc for w in rs.pool._workers]
        assert all(proc.poll() is None for proc in live)
    assert all(proc.poll() is not None for proc in live), "closing the set must end its workers"


FORK_UID = 60000 + os.getpid() % 5000
"""The workers' uid (as root) in the tests whose rewards fork: RLIMIT_NPROC counts per user, so a fork bomb in another
pytest process on this box (whose pools run as nobody, or as its own such uid) cannot starve their forks."""


def leftovers(pool) -> set[int]:
    """Live processes that carry the pool's token: its workers and whatever they started (rewards/containment.py)."""
    prefix = f"{TOKEN_VAR}={pool.box.token}:".encode()
    return members([], lambda entry: entry.startswith(prefix))


@pytest.mark.parametrize("name", ["sleeps", "pause_ignoring_sigterm", "gil_loop", "fork_bomb"])
def test_a_reward_that_never_answers_is_killed_with_all_it_started(workdir, name) -> None:
    """A sleep, signal.pause with SIGTERM ignored, a C loop that holds the GIL, a fork bomb: each call times out,
    the worker and every process it started are killed, and the pool scores on. The fork bomb is bounded by
    RLIMIT_NPROC (rewards.pool.max_tasks) and refuses to start where it finds no bound, so the test cannot take the
    box. Fails on main at 85b20f9 for the fork bomb (no task limit: it refuses, `raised`, where a bound pool times
    out). The `ok` calls beside it must answer within the 4 s timeout: milliseconds of work. Right after the kill
    a reward can fork again: the killed copies no longer count against the task bound (they were reaped; before
    rewards.containment.settle waited for that, the fork failed with EAGAIN after a fork bomb)."""
    fns = {0: f"user_rewards:{name}", 1: "user_rewards:ok", 2: "user_rewards:daemon"}
    one, two = ({"prompts": ["p"] * n, "completions": ["c"] * n} for n in (1, 2))
    with RewardPool(fns, fns, RewardPoolConfig(workers=2, timeout_s=4, max_tasks=16, user=FORK_UID)) as pool:
        hang, ok = pool.run([Call(0, two), Call(1, two)])
        assert hang.kind == "timeout" and "no answer within 4 s" in hang.message, (hang.kind, hang.message)
        assert ok.values == [1.0, 1.0]
        assert len(leftovers(pool)) == 2, "only the two workers may be left after the kill"
        assert pool.run([Call(1, one)])[0].values == [1.0], "the pool scores on after the kill"
        forked = pool.run([Call(2, one)])[0]  # `daemon`: it forks
        assert forked.kind is None, f"a fork right after the kill failed: {forked.message}"
    assert not leftovers(pool), "the closed pool left processes behind"


def test_a_segfault_is_a_crash_and_the_worker_is_replaced(workdir) -> None:
    """A reward that segfaults (ctypes) ends its worker: `crash`, named by its signal, and a fresh worker. (Passes
    on main at 85b20f9 too: this pins it.)"""
    with rewards({"fn": "user_rewards:segfault"}, {"fn": "user_rewards:ok"}) as rs:
        result = rs.score(samples(["a"]))
        assert result.failures["crash"] == 1 and "killed by SIGSEGV" in result.errors[0]
        assert rs.score(samples(["b"])).per_name["ok"] == [1.0]


def test_a_reply_over_the_cap_is_invalid_and_the_worker_replaced(workdir) -> None:
    """A reward that writes a 65 MiB message into its worker's pipe (past the worker's own JSON) is refused at the
    64 MiB cap (rewards.pool.MAX_REPLY_BYTES) without the driver reading it: `invalid`, the worker replaced.
    (Passes on main at 85b20f9 too: this pins it.)"""
    with rewards({"fn": "user_rewards:huge_reply"}) as rs:
        before = {w.proc.pid for w in rs.pool._workers}
        result = rs.score(samples(["a"]))
        assert result.failures["invalid"] == 1 and "unreadable reply" in result.errors[0], result.errors
        assert len(before - {w.proc.pid for w in rs.pool._workers}) == 1, "the worker that sent it was not replaced"


def test_a_flood_on_stderr_is_cut_and_the_call_still_scores(workdir, caplog, capfd) -> None:
    """A reward that writes 108 MiB to stderr: its worker's output is logged up to 64 KiB per call and the rest
    dropped with one line; the driver's own stderr gets none of it. Fails on main at 85b20f9 (workers wrote to the
    driver's stderr: the run's log took all 108 MiB). The second call's drop is reported when the worker's pipe
    closes, which closing the pool now waits for: CI at 9e6dceb saw one line (a log thread slower than the test)."""
    caplog.set_level(logging.INFO, logger="rewards.worker")
    with rewards({"fn": "user_rewards:floods_stderr"}) as rs:
        assert rs.score(samples(["a"])).per_name["floods_stderr"] == [1.0]
        assert rs.score(samples(["b"])).per_name["floods_stderr"] == [1.0]
    logged = [r.getMessage() for r in caplog.records if r.name == "rewards.worker"]
    dropped = [line for line in logged if "of its output dropped" in line]
    assert len(dropped) == 2, logged[-3:]
    assert sum(map(len, logged)) < 3 * MAX_BYTES_PER_CALL, "more than the per-call budget was logged"
    assert len(capfd.readouterr().err) < 1 << 20, "the flood reached the driver's stderr"


@pytest.mark.parametrize("then", ["return", "exit"])
@pytest.mark.parametrize("kind", ["cgroup2", "cgroup1", "tree"])
def test_a_setsid_grandchild_dies_with_its_worker_and_with_the_pool(workdir, kind, then) -> None:
    """A reward starts a grandchild in a session of its own that outlives its parent. Whichever container the
    machine gives (each kind tested here; this box and CI have all three), it dies with the pool when the pool
    closes ("return"), and with its worker when the worker dies on its own ("exit": os._exit, the pool replaces it).
    Fails on main at 85b20f9 (the grandchild escaped the process-group kill and lived on)."""
    cfg = RewardPoolConfig(workers=1, user=FORK_UID)
    with RewardPool({0: "user_rewards:daemon"}, {0: "daemon"}, cfg, containment=kind) as pool:
        outcome = pool.run([Call(0, {"prompts": ["p"], "completions": ["a"], "then": then})])[0]
        grandchild = int((workdir / "out" / "daemon.pid").read_text())
        if then == "exit":
            assert outcome.kind == "crash" and not _alive(grandchild), "the grandchild outlived its worker"
        else:
            assert outcome.values == [grandchild] and _alive(grandchild)
    assert not _alive(grandchild) and not leftovers(pool), f"pid {grandchild} outlived the pool ({kind})"
    assert kind == "tree" or not pool.box.path.exists(), f"the pool's cgroup {pool.box.path} was left behind"


def test_a_reward_imports_from_folders_its_user_cannot_reach(workdir) -> None:
    """As root the worker runs as nobody, while the driver's Python (here under /root, mode 0700) is not nobody's to
    read: the folders of sys.path and the packages imported before the switch are reached through file descriptors
    opened before it. Fails without that (ModuleNotFoundError for multiprocessing.pool as nobody); on main at
    85b20f9 the workers ran as root, so it passed there."""
    with rewards({"fn": "user_rewards:lazy_imports"}) as rs:
        result = rs.score(samples(["a"]))
    assert result.per_name["lazy_imports"] == [1.0], result.errors


def test_as_root_a_worker_cannot_raise_its_limits_signal_the_driver_or_write_the_run_directory(workdir) -> None:
    """With the driver root, workers run as rewards.pool.user (nobody) with every limit set (soft = hard), and are
    not told the driver's PID. Fails on main at 85b20f9 (workers ran as root: all three escapes worked)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the driver must be root for its workers to drop to nobody")
    cfg = {"memory_mb": 512, "max_tasks": 40, "max_file_mb": 3, "max_open_files": 100}
    with rewards({"fn": "user_rewards:escape"}, {"fn": "user_rewards:limits"}, pool=cfg) as rs:
        result = rs.score(samples(["a", "b", "c", "d", "e"][:3]), [3])
        assert result.per_name["escape"] == [0.0, 0.0, 0.0], "raise limits, signal the driver, write the cwd"
        limits = rs.score(samples(["a", "b", "c", "d", "e"])).per_name["limits"]
        nproc = rs.pool._init["limits"]["RLIMIT_NPROC"]
        assert limits == [512 << 20, nproc, 3 << 20, 100, pwd.getpwnam("nobody").pw_uid]
        assert nproc - 40 < 40, f"RLIMIT_NPROC {nproc} is not nobody's few tasks plus max_tasks"
        for worker in rs.pool._workers:
            args = Path(f"/proc/{worker.proc.pid}/cmdline").read_bytes().split(b"\0")
            assert str(os.getpid()).encode() not in args, "the worker was told the driver's PID"
    assert not (workdir / "escaped").exists()


def test_a_worker_is_not_told_the_drivers_pid(workdir) -> None:
    """What a worker is given, its environment's pool token (AHA_REWARD_POOL) and its cgroup's path, carries no PID of
    the driver. Fails on main at 50ebc49: the token began with it (`<driver pid>-<n>-<hex>:<slot>`), in both."""
    driver = re.compile(rf"(?<![0-9a-f]){os.getpid()}(?![0-9a-f])")
    with rewards({"fn": "user_rewards:ok"}) as rs:
        assert rs.score(samples(["a"])).per_name["ok"] == [1.0]
        for worker in rs.pool._workers:
            environ = Path(f"/proc/{worker.proc.pid}/environ").read_bytes().split(b"\0")
            token = next(v.decode() for v in environ if v.startswith(f"{TOKEN_VAR}=".encode()))
            cgroup = Path(f"/proc/{worker.proc.pid}/cgroup").read_text()
            for told in (token, cgroup):
                assert not driver.search(told), f"the worker was told the driver's PID {os.getpid()}: {told!r}"


@pytest.mark.parametrize("network", [False, True])
def test_a_reward_reaches_no_socket_of_the_host_unless_the_config_gives_it_the_network(workdir, caplog, network):
    """By default each worker is in an empty network namespace of its own: a reward that connects to every TCP socket
    listening on the host (a listener this test holds on the loopback among them; in the training run of
    tests/integration/test_user_task.py, the run's engine) connects to none, and the pool's start line says so;
    `rewards.pool.network: true` gives the host's network back (the same reward reaches the listener: the check can
    fail). Fails on main at 98997ee: workers shared the host's network and `rewards.pool.network` did not exist."""
    import socket

    log = workdir / "out" / "calls_out.jsonl"
    with socket.create_server(("127.0.0.1", 0)) as listener, caplog.at_level(logging.INFO, logger="rewards.pool"):
        here = f"127.0.0.1:{listener.getsockname()[1]}"
        with rewards({"fn": "user_rewards:calls_out", "params": {"log_to": "out/calls_out.jsonl"}},
                     pool={"network": network, "workers": 1}) as rs:
            result = rs.score(samples(["a"]))
    [call] = [json.loads(line) for line in log.read_text().splitlines()]
    assert here in call["tried"], f"the reward did not see the listener {here} among {call['tried']}"
    start = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("reward pool:"))
    if network:
        assert here in call["connected"] and result.per_name["calls_out"][0] >= 1, call
        assert "on the host's network (rewards.pool.network: true)" in start, start
    else:
        assert call["connected"] == [] and result.per_name["calls_out"] == [0.0], call
        # IPv4: no route at all; IPv6: not even a source address (no interface is up)
        assert set(call["errors"]) <= {"OSError: Network is unreachable", "OSError: Cannot assign requested address"}
        assert "with no network" in start, start


@pytest.mark.parametrize("name, message", [
    ("wrong_length", "returned 1 values for 2 completions"),
    ("not_numbers", "value 0 is str 'high': not a number or None"),
    ("infinite", "value 0 is float 'inf': an infinity"),
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
import sys
from rewards.config import RewardPoolConfig
from rewards.pool import Call, RewardPool
pool = RewardPool({0: "user_rewards:daemon"}, {0: "daemon"},
                  RewardPoolConfig(workers=1, timeout_s=1000, user=int(sys.argv[2])), containment=sys.argv[1])
print(pool._workers[0].proc.pid, flush=True)
pool.run([Call(0, {"prompts": ["p"], "completions": ["c"], "then": "sleep"})])
"""


@pytest.mark.parametrize("kind", ["cgroup2", "cgroup1", "tree"])
def test_workers_and_all_they_started_die_with_a_killed_driver(workdir, kind) -> None:
    """A driver killed with SIGKILL runs no cleanup: the kernel (PR_SET_PDEATHSIG) must end its hung worker, and the
    pool's keeper the setsid grandchild that worker started, whichever the container. Fails on main at 85b20f9 (the
    grandchild lived on)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DRIVER), kind, str(FORK_UID)], cwd=workdir,
                              env=env, stdout=subprocess.PIPE, text=True)
    worker = int(driver.stdout.readline())
    pid_file = workdir / "out" / "daemon.pid"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not pid_file.exists():  # the call reached the worker, the daemon is up
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_alive(worker) or _alive(grandchild)):
        time.sleep(0.2)
    assert not _alive(worker), f"worker {worker} outlived its killed driver"
    assert not _alive(grandchild), f"the worker's setsid grandchild {grandchild} outlived the killed driver"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before or while read (ESRCH on read)
        return False
