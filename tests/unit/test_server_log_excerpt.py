"""A dead engine's report leads with its root cause, not with the shutdown noise that ends its log."""

from __future__ import annotations

from rollout.server_process import error_excerpt

STARTUP = [f"(APIServer pid=7) INFO 11-25 13:00:{i:02d} [api_server.py:1] starting, step {i}\n" for i in range(40)]
WARNING = ["(APIServer pid=7) WARNING 11-25 13:00:41 [system_utils.py:255] Found ulimit of 20000: this can cause "
           "fd limit errors like `OSError: [Errno 24] Too many open files`.\n"]
CAUSE = [
    "(EngineCore_DP0 pid=9) ERROR 11-25 13:24:21 [core.py:843] EngineCore encountered a fatal error.\n",
    "(EngineCore_DP0 pid=9) ERROR 11-25 13:24:21 [core.py:843] Traceback (most recent call last):\n",
    "(EngineCore_DP0 pid=9) ERROR 11-25 13:24:21 [core.py:843]   File \"core.py\", line 834, in run_engine_core\n",
    "(EngineCore_DP0 pid=9) ERROR 11-25 13:24:21 [core.py:843] RuntimeError: the root cause\n",
]
NOISE = [f" - leaked function \"create_{i}\"\n" for i in range(60)] + ["[engine_launcher] server exited with code 0\n"]


def test_the_first_error_report_comes_first_then_the_last_lines():
    excerpt = error_excerpt(STARTUP + WARNING + CAUSE + NOISE, context=10, tail=3)
    lines = excerpt.splitlines()
    assert lines[0] == CAUSE[0].rstrip("\n")  # not the WARNING that merely mentions an error
    assert "RuntimeError: the root cause" in excerpt
    assert lines[-1] == "[engine_launcher] server exited with code 0"
    assert "[...]" in lines and len(lines) == 10 + 1 + 3


def test_without_an_error_report_the_excerpt_is_the_tail():
    lines = STARTUP + WARNING + NOISE
    assert error_excerpt(lines, context=10, tail=3) == "".join(lines[-13:])


def test_an_error_within_the_tail_is_not_shown_twice():
    lines = STARTUP + CAUSE
    assert error_excerpt(lines, context=10, tail=3) == "".join(lines[-13:])
