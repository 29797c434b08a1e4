"""Reward functions that misbehave as a user's could (raise, exit, fork without end, ignore SIGTERM, hold the GIL),
as source text: the pool's unit tests and the training run with hostile terms write it into the module their
workers import (it needs `os` and `signal` imported above it)."""

HOSTILE = '''
def raises(prompts, completions, **kwargs):
    raise ValueError("scorer bug")

def exits(prompts, completions, **kwargs):
    os._exit(3)

def fork_bomb(prompts, completions, **kwargs):
    import resource
    if os.getuid() == 0 or resource.getrlimit(resource.RLIMIT_NPROC)[0] > 10_000:
        raise RuntimeError("no task bound here: a fork bomb would take the box, so this one refuses to start")
    while True:
        try:
            os.fork()
        except OSError:
            pass

def pause_ignoring_sigterm(prompts, completions, **kwargs):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pause()

def gil_loop(prompts, completions, **kwargs):
    return [float(sum(range(10**15)))] * len(completions)  # one C call that never releases the GIL
'''
