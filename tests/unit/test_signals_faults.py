"""Interrupts honoured however the process was started, the fault-hook spec, and per-request seeds.

The signal test runs a real child interpreter started with SIGINT *ignored*, as a background job of a
non-interactive shell or nohup starts it (where Python installs no KeyboardInterrupt handler), and checks from
/proc that the disposition really was inherited before `signals.install()` takes over.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration import signals
from orchestration.config.files import load_config
from orchestration.faults import HELD_PART, PHASES, Fault, parse
from orchestration.loop import request_seeds

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys, threading
ignored = int(next(l for l in open('/proc/self/status') if l.startswith('SigIgn')).split()[1], 16)
print('inherited-ignored', bool(ignored & (1 << (SIGNUM - 1))), flush=True)
from orchestration import signals
signals.install()
try:
    print('ready', flush=True)
    threading.Event().wait()
except signals.Interrupted as exc:
    print('interrupted', exc.name, flush=True)
    sys.exit(exc.exit_code())
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_inherited_as_ignored_still_interrupts(signum):
    def ignore():
        signal.signal(signum, signal.SIG_IGN)

    child = subprocess.Popen([sys.executable, "-c", f"SIGNUM = {int(signum)}\n" + CHILD], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True, preexec_fn=ignore)
    try:
        assert child.stdout.readline().split() == ["inherited-ignored", "True"], "the child did not inherit SIG_IGN"
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signum)
        out, _ = child.communicate(timeout=30)
    finally:
        child.kill()
    assert out.split() == ["interrupted", signum.name], f"no Interrupted raised for {signum.name}: {out!r}"
    assert child.returncode == 128 + signum, f"exit code {child.returncode}, expected 128 + {int(signum)}"


def test_a_plain_keyboard_interrupt_gets_its_signal_back():
    """Ray re-raises the Interrupted our handler raised inside `ray.get` as a plain KeyboardInterrupt: the signal
    the handler took is what `interrupted` reports (a SIGTERM must not read as SIGINT, exit 143 not 130)."""
    previous = signal.getsignal(signal.SIGTERM)
    signals.install()
    try:
        with pytest.raises(signals.Interrupted):
            signal.raise_signal(signal.SIGTERM)
        exc = signals.interrupted(KeyboardInterrupt())
        assert (exc.name, exc.exit_code()) == ("SIGTERM", 128 + signal.SIGTERM)
        own = signals.Interrupted(signal.SIGINT)
        assert signals.interrupted(own) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_fault_spec_parses_and_rejects_bad_entries():
    assert parse("") == []
    assert parse("learn:sigint@2, push:kill_engine") == [Fault("learn", "sigint", 2), Fault("push", "kill_engine")]
    assert parse("save:sigterm_blocked@3") == [Fault("save", "sigterm_blocked", 3)]
    for bad in ("learn", "lern:sigint", "learn:explode", "learn:sigint@two"):
        with pytest.raises(ValueError, match="phase:action"):
            parse(bad)
    assert parse("eval:hold@1") == [Fault("eval", "hold", 1)]
    # Every phase can be held: score stops the reward pool's workers, between holds the driver's main thread.
    assert parse("score:hold,between:hold@2") == [Fault("score", "hold"), Fault("between", "hold", 2)]
    assert set(HELD_PART) == set(PHASES), "a phase a test cannot hold from outside"


def test_request_seeds_depend_on_seed_step_and_prompt_only():
    cfg = load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml")
    seeds = request_seeds(cfg, 3, 4)
    assert seeds == request_seeds(cfg, 3, 4), "seeds must be a pure function of (train.seed, step, index)"
    assert len(set(seeds + request_seeds(cfg, 4, 4))) == 8, "seeds repeat across prompts or steps"
    other = load_config(ROOT / "configs" / "countdown_smollm2_cpu.yaml", ["train.seed=1"])
    assert request_seeds(other, 3, 4) != seeds, "train.seed is not used"
    assert all(0 <= s < 2**31 for s in seeds), "seeds must fit the engines' 32-bit signed seed"
