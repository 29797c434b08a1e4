"""Supervisor that runs an engine server and takes its whole process group down with it.

    python -I rollout/engine_launcher.py -m vllm.entrypoints.openai.api_server ARGS...

Why: the server (vLLM's API server) spawns an engine-core process holding the model (~5 GB). If the Ray actor that
owns the server is killed (Ray then SIGKILLs the worker's direct children), or the API server dies, the engine core
was seen to linger as an orphan. This launcher is the process-group leader: it and the server each ask the kernel
for SIGTERM when their parent dies (a SIGTERMed API server shuts its engine core down), and on SIGTERM or when the
server exits the launcher stops every process of its group (SIGTERM, then SIGKILL).

Runs in the engine's interpreter (Python 3.11, stdlib only). `-I` keeps this folder (our modules) and PYTHONPATH
off sys.path, so the engine imports only its own env's packages.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
GRACE_S = 15.0
LEFT_GRACE_S = 3.0
"""Seconds what is left of the group (the engine core, a worker) has to exit on SIGTERM once the server is gone,
before SIGKILL. The launcher exits as soon as nothing is left: a fixed sleep here made every engine stop (each run's
end, each replica restart) 3 s longer, though the group was usually empty well before."""
POLL_S = 0.1
_stop_requested: list[float] = []


def on_sigterm(*_: object) -> None:
    # Only signal here: waiting on the child inside a handler would race Popen's own wait lock.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _stop_requested.append(time.monotonic())
    os.killpg(0, signal.SIGTERM)


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when this process's parent dies (Ray kills actors with SIGKILL, so nothing of
    ours runs then). Also called by the SGLang-JAX server (rollout/sglang_jax_entry.py), which needs no launcher."""
    ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def group_left() -> list[int]:
    """The live processes of this launcher's process group but itself (Linux /proc; zombies hold nothing)."""
    pgid, me, found = os.getpgid(0), os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone since listed
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after its last ")".
        state, _, pgrp = stat[stat.rindex(b")") + 2:].split()[:3]
        if state != b"Z" and int(pgrp) == pgid:
            found.append(int(name))
    return found


def pin_to_cores() -> None:
    """Restrict this process (and so the server it starts, every thread of it) to $AHA_CPU_CORES
    (rollout.backend.cpu_cores). The launcher has one thread here, so pinning it pins the process (a process with
    more needs common/affinity.py `pin_process`, which this stdlib-only, `-I` program cannot import)."""
    if cores := os.environ.get("AHA_CPU_CORES"):
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})


def main() -> None:
    die_with_parent()
    pin_to_cores()
    if str(os.getppid()) != os.environ.get("AHA_LAUNCHER_PARENT", str(os.getppid())):
        sys.exit("[engine_launcher] the process that started me is already gone; not starting the server")
    # Ray SIGKILLs a dying worker's direct children (this launcher) before any clean-up can run, so the server
    # gets its own death signal tied to this launcher. preexec_fn is safe here: this process has one thread.
    child = subprocess.Popen([sys.executable, *sys.argv[1:]], preexec_fn=die_with_parent)
    signal.signal(signal.SIGTERM, on_sigterm)
    while child.poll() is None:
        if _stop_requested and time.monotonic() - _stop_requested[0] > GRACE_S:
            break
        time.sleep(0.2)
    # The server is gone (or ignored SIGTERM for GRACE_S): end whatever is left of the group, this launcher last.
    reason = "stop requested" if _stop_requested else f"server exited with code {child.returncode}"
    print(f"[engine_launcher] {reason}; stopping process group {os.getpgid(0)}", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + LEFT_GRACE_S
    while group_left() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    main()
