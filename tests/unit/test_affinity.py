"""common/affinity.py: pinning a process moves the threads it already had, and what they start later.

`os.sched_setaffinity(0, ...)`, what the learner actor did before (issue 37), moves the calling thread only: the
threads started earlier keep every core, and so do the threads they start. This test fails with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_pin_process_moves_earlier_threads_and_their_children():
    cores = sorted(os.sched_getaffinity(0))
    target = cores[-1]
    # A child process, so this test's own process keeps its cores.
    code = textwrap.dedent(f"""
        import os, threading
        from common.affinity import allowed_cores, pin_process
        go, spawned, done = threading.Event(), [], threading.Event()
        def early():  # started before the pin; starts a thread of its own after it
            go.wait()
            t = threading.Thread(target=done.wait); t.start(); spawned.append(t)
            done.wait()
        first = threading.Thread(target=early); first.start()
        pin_process([{target}])
        go.set()
        while not spawned:
            pass
        masks = allowed_cores(os.getpid())
        done.set()
        print(len(masks), sorted({{c for m in masks.values() for c in m}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    count, allowed = out.stdout.split(" ", 1)
    assert int(count) == 3, f"expected the main thread, the early one and its child: {out.stdout}"
    assert allowed.strip() == f"[{target}]", f"a thread is allowed off core {target}: {out.stdout}"
