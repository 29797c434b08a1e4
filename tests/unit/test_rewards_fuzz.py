"""Property-based fuzz: model output is hostile input.

Over thousands of adversarial strings (tag soup, operator and nesting bombs, code, unicode) every reward must
return a value in its declared range, within 100 ms of CPU time, without raising, importing, opening files or
running code. The time bound is on the reward's own cost, which is a property of the input: the garbage collector
is off while a reward runs (a full collection walks the whole process's heap, JAX's included: 0.86 s once in CI),
and a call over the bound is measured twice more, its least time judged, so one pause of a loaded machine cannot
fail the test while a real blow-up (catastrophic backtracking, a quadratic scan) still does, every time. An audit hook (PEP 578) watches for the side effects while a reward runs; `compile` is allowed because
`ast.parse` raises it while only building a syntax tree.
"""

from __future__ import annotations

import gc
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewards import countdown, format, math_answer
from rewards.repetition import RepetitionPenalty
from rewards.types import Sample

CPU_LIMIT_S = 0.1
FORBIDDEN_EVENTS = ("open", "import", "exec", "os.", "subprocess.", "socket.", "shutil.", "ctypes.", "pty.")
_watch: list[str] = []
_watching = False


def _audit(event: str, args: tuple) -> None:
    if _watching and event.startswith(FORBIDDEN_EVENTS):
        _watch.append(event)


sys.addaudithook(_audit)  # cannot be removed; it is inert unless _watching is set

TOKENS = [
    "<answer>", "</answer>", "<think>", "</think>", "<answer", "answer>", "\\boxed{", "\\frac{", "{", "}", "####",
    "(", ")", "**", "*", "/", "//", "-", "+", "%", "=", ".", ",", "$", " ", "\n", "\t", "\u200b", "0", "1", "3", "7",
    "25", "99999999999", "1e999999", "nan", "inf", "-0", "__import__('os').system('touch x')", "open('x','w')",
    "lambda:0", "[1]", "x", "٣", "３", "𝟙", "\u2212", "\x00", "\ud7ff", "\ud800", "é", "🤖", "\\text{", "\\\\",
    "'", '"',
]


def _answer(body: str) -> str:
    return f"<think>x</think><answer>{body}</answer>"


token_soup = st.lists(st.sampled_from(TOKENS), max_size=120).map("".join)
adversarial = st.one_of(
    st.text(max_size=300),
    token_soup,
    token_soup.map(_answer),
    st.builds(lambda n, s: _answer("(" * n + s + ")" * n), st.integers(0, 400), st.text(max_size=20)),
    st.builds(lambda n, op: _answer(op.join(["9"] * n)), st.integers(1, 300), st.sampled_from(["*", "**", "/", "-"])),
    st.builds(lambda n, op: _answer(op * n + "7"), st.integers(1, 300), st.sampled_from(["-", "+", "~", "not "])),
    st.builds(lambda n: "\\boxed{" * n + "1" + "}" * (n // 2), st.integers(1, 500)),
)
numbers = st.lists(st.integers(1, 100), min_size=3, max_size=4)
REPETITION = RepetitionPenalty()


def _cpu_seconds(fn, *args):
    """(value, CPU seconds of this thread) of one call, the collector off (its pauses are not the call's cost)."""
    global _watching
    was_enabled = gc.isenabled()
    gc.disable()
    _watching = True
    start = time.thread_time()  # CPU time of this thread: other jobs on the shared cores do not count
    try:
        value = fn(*args)
    finally:
        elapsed = time.thread_time() - start
        _watching = False
        if was_enabled:
            gc.enable()
    return value, elapsed


def _timed(fn, *args) -> float:
    before = set(sys.modules)
    value, elapsed = _cpu_seconds(fn, *args)
    for _ in range(2):  # over the bound: a blow-up repeats, a pause of the machine does not
        if elapsed < CPU_LIMIT_S:
            break
        elapsed = min(elapsed, _cpu_seconds(fn, *args)[1])
    assert elapsed < CPU_LIMIT_S, f"{fn.__module__}.{fn.__qualname__} took {elapsed:.3f} s on {args[0][:80]!r}"
    assert set(sys.modules) == before, f"scoring imported {set(sys.modules) - before}"
    assert not _watch, f"scoring raised audit events {_watch} on {args[0][:80]!r}"
    return value


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(completion=adversarial, nums=numbers, target=st.integers(-5, 1000), answer=st.integers(-10**6, 10**6))
def test_rewards_never_raise_hang_or_act(completion: str, nums: list[int], target: int, answer: int) -> None:
    assert _timed(countdown.score, completion, nums, target) in (0.0, 0.1, 1.0)
    assert _timed(math_answer.score, completion, str(answer)) in (0.0, 1.0)
    assert _timed(format.score, completion) in (0.0, 0.5, 1.0)
    assert _timed(REPETITION, Sample("p", completion, {})) in (0.0, -0.5, -1.5, -3.0)


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>" * 100_000,  # many opening tags, no closing one: quadratic for a lazy regex
        "</answer>" * 100_000,
        "<answer>" + "(" * 100_000 + "</answer>",
        "<answer>" + "9" * 100_000 + "</answer>",
        "\\boxed{" * 100_000,
        "#### " + "9" * 100_000,
        "<think>" * 50_000 + "</think><answer>1</answer>",
        "word " * 40_000,  # 200 kB of one repeated word
    ],
)
def test_huge_inputs_stay_fast(completion: str) -> None:
    assert _timed(countdown.score, completion, [1, 2, 3], 6) in (0.0, 0.1, 1.0)
    assert _timed(math_answer.score, completion, "9") in (0.0, 1.0)
    assert _timed(format.score, completion) in (0.0, 0.5, 1.0)
    assert _timed(REPETITION, Sample("p", completion, {})) in (0.0, -0.5, -1.5, -3.0)


def test_audit_hook_would_catch_a_file_write(tmp_path) -> None:
    """Guards the guard: the watcher must see the side effects the fuzz test claims never happen."""
    global _watching
    _watching = True
    try:
        (tmp_path / "x").write_text("x")
    finally:
        _watching = False
    seen, _watch[:] = list(_watch), []
    assert "open" in seen


def test_time_bound_would_catch_a_slow_reward() -> None:
    """Guards the time guard: a reward that is slow on every call still fails, re-measuring or not."""

    def slow(_completion: str) -> float:
        end = time.thread_time() + 2 * CPU_LIMIT_S
        while time.thread_time() < end:
            pass
        return 0.0

    with pytest.raises(AssertionError, match="took"):
        _timed(slow, "x")
