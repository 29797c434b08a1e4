"""Reward functions that misbehave as a user's could (raise, exit, fork without end, ignore SIGTERM, hold the GIL,
call every service listening on the host),
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

def calls_out(prompts, completions, log_to, **kwargs):
    """Connects to every TCP socket listening in the driver's network (its parent's /proc/PID/net/tcp and tcp6: the
    run's engines, Ray, anything on the loopback), appends {"tried", "connected", "errors"} to `log_to` and scores
    the connections that succeeded."""
    import json, socket
    tried, connected, errors = [], [], set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{os.getppid()}/net/{table}") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
        for row in rows:
            if row[3] != "0A":  # not LISTEN
                continue
            address, port = row[1].split(":")
            port = int(port, 16)
            host = "127.0.0.1" if family == socket.AF_INET else "::1"
            if family == socket.AF_INET and address not in ("00000000", "0100007F"):
                host = socket.inet_ntoa(bytes.fromhex(address)[::-1])
            tried.append(f"{host}:{port}")
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(1.0)
                try:
                    sock.connect((host, port))
                    connected.append(f"{host}:{port}")
                except OSError as exc:
                    errors.add(type(exc).__name__ + ": " + (exc.strerror or str(exc)))
    with open(log_to, "a") as f:
        f.write(json.dumps({"tried": tried, "connected": connected, "errors": sorted(errors)}) + "\\n")
    return [float(len(connected))] * len(completions)
'''
