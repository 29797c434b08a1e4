"""Every part on another host, for real: a Ray cluster of four nodes, each in its own network namespace with its own
address, loopback and /tmp (tests/integration/multinode.py), plus a GCS emulator that every node reaches as shared
storage. One cluster serves the whole module.

Nodes: `head` (the job's driver), `b` (the learner: `learner.resources.custom: {node_b: 1}`), `c` and `d` (one engine
replica each: `rollout.resources.custom: {engine_host: 1}`, one engine_host per node).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import storage as uri
from tests.integration.multinode import MultiNodeCluster, require_namespaces
from test_train_e2e import TINY as E2E_TINY  # the demo config shrunk to the tiny model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/countdown_smollm2_cpu.yaml"
TINY = [*E2E_TINY, "rollout.backend.kv_cache_space_gb=1"]  # the nodes share one box: a smaller KV cache per engine
NODES = {"head": {}, "b": {"node_b": 1}, "c": {"node_c": 1, "engine_host": 1}, "d": {"node_d": 1, "engine_host": 1}}
ENGINES = "rollout.resources.custom={engine_host: 1}"


@pytest.fixture(scope="module")
def cluster():
    if why := require_namespaces():
        pytest.fail(why, pytrace=False)
    with MultiNodeCluster(NODES) as c:
        c.make_bucket("aha-runs")
        previous = os.environ.get(uri.EMULATOR)
        os.environ[uri.EMULATOR] = c.gcs_url  # this process reads the runs' files from the same bucket
        try:
            yield c
        finally:
            os.environ.pop(uri.EMULATOR) if previous is None else os.environ.__setitem__(uri.EMULATOR, previous)


def job_output(job) -> str:
    return f"exit {job.returncode}\n{job.stdout[-6000:]}\n{job.stderr[-2000:]}"


def test_nodes_are_separate_hosts(cluster):
    """Each node has its own address, loopback and disk; the emulator is the one thing all of them share."""
    b, c = cluster.ips["b"], cluster.ips["c"]
    wrote = cluster.run_on("b", ["sh", "-c", "echo from-b > /tmp/aha-probe && cat /tmp/aha-probe"])
    assert wrote.stdout.strip() == "from-b", wrote.stderr
    assert cluster.run_on("c", ["test", "-e", "/tmp/aha-probe"]).returncode == 1, "node c sees node b's /tmp"
    assert not Path("/tmp/aha-probe").exists(), "this process sees node b's /tmp"
    # A server on b's loopback is unreachable from c; on b's own address it is reachable.
    server = ("import http.server as h, sys\n"
              "h.HTTPServer((sys.argv[1], 18080), h.SimpleHTTPRequestHandler).handle_request()")
    probe = ("import httpx, sys\ntry:\n    print(httpx.get(sys.argv[1], timeout=3).status_code)\n"
             "except httpx.HTTPError as e:\n    print(type(e).__name__)")
    for bind, reachable in (("127.0.0.1", False), (b, True)):
        target = cluster.procs["b"].pid
        srv = subprocess.Popen(["nsenter", "-t", str(target), "-n", "-m", "--", sys.executable, "-c", server, bind],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://{'127.0.0.1' if bind == '127.0.0.1' else b}:18080/"
            got = ""
            for _ in range(20):  # the server takes a moment to bind
                got = cluster.run_on("c", [sys.executable, "-c", probe, url]).stdout.strip()
                if got != "ConnectError" or not reachable:
                    break
            assert (got == "200") == reachable, f"{url} from node c ({c}): {got}"
        finally:
            srv.kill()
            srv.wait()
    for node in ("head", "c"):
        seen = cluster.run_on(node, [sys.executable, "-c", f"import httpx; print(httpx.get('{cluster.gcs_url}"
                                                          "/storage/v1/b/aha-runs').status_code)"])
        assert seen.stdout.strip() == "200", f"node {node} cannot reach the shared storage: {seen.stderr[-500:]}"


def test_local_run_dir_on_several_nodes_is_refused_at_start(cluster):
    """Fails on main: there the run started with its run dir on the learner's host alone (and, with the engine on
    another node, died at its first generation with a traceback)."""
    job = cluster.submit(["python", "-m", "orchestration.cli.train", "--config", CONFIG, "--run-dir", "/tmp/aha-run",
                          *TINY, "train.steps=1"], timeout_s=300)
    assert job.returncode != 0, job_output(job)
    lines = [line for line in (job.stdout + job.stderr).splitlines() if "run dir error:" in line]
    # One line (Ray's job status may quote the job's log tail, so it can be shown twice).
    assert lines and len(set(lines)) == 1, job_output(job)
    assert "local path" in lines[0] and "gs://" in lines[0] and "run_dir_shared" in lines[0], lines[0]


def read_rows(run: str) -> list[dict]:
    return [json.loads(line) for line in uri.read_text(uri.join(run, "metrics.jsonl")).splitlines()]


def engine_nodes(summary: dict) -> list[str]:
    return [url.removeprefix("http://").rsplit(":", 1)[0] for url in summary["placement"]["engines"]]


@pytest.fixture(scope="module")
def lost_node_run(cluster):
    """`ray job submit` of 3 steps: driver on the head, learner on b, replicas on c and d, run dir on the bucket;
    the last replica's node is killed after step 1 (`between:kill_node@1`)."""
    run = "gs://aha-runs/lost-node"
    job = cluster.submit(["python", "-m", "orchestration.cli.train", "--config", CONFIG, "--run-dir", run, *TINY,
                          "train.steps=3", "rollout.replicas=2", ENGINES, "learner.resources.custom={node_b: 1}"],
                         env_vars={"AHA_FAULT": "between:kill_node@1"})
    return run, job


def test_three_steps_finish_with_engines_on_other_nodes_and_one_node_lost(cluster, lost_node_run):
    """Fails on main: there the driver dialled each engine at 127.0.0.1 (the engine's own loopback, on another
    node), so the first generation failed; and `--run-dir gs://...` became the local folder `gs:/...`."""
    run, job = lost_node_run
    assert job.returncode == 0, job_output(job)
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3], "a step was lost with the engine's node"
    assert sum(r["rollout/restarts"] for r in rows) >= 1, "the lost replica was not recorded"
    assert [r["rollout/adapter_version"] for r in rows] == [1, 2, 3]
    summary = json.loads(uri.read_text(uri.join(run, "summary.json")))
    where = summary["placement"]
    assert where["driver"] == cluster.ips["head"] and where["learner"].startswith(cluster.ips["b"] + " "), where
    assert sorted(engine_nodes(summary)) == sorted([cluster.ips["c"], cluster.ips["d"]]), where
    assert summary["adapter"] == uri.join(run, "adapter")
    assert json.loads(uri.read_text(uri.join(run, "adapter", "adapter_config.json")))["peft_type"] == "LORA"
    assert "3" in uri.list_names(uri.join(run, "checkpoints")), "the learner's checkpoint is not on the bucket"
    assert rows[-1]["rollout/replica0/requests"] > 0 and rows[-1]["rollout/replica1/requests"] > 0


def test_resume_with_the_learner_on_another_node_keeps_every_row(cluster, lost_node_run):
    """`--resume` of a longer run (5 steps) with the learner on c instead of b and one engine (the single-engine
    path, on a node other than the driver's): it continues from the checkpoint of step 3, every earlier row kept."""
    run, first = lost_node_run
    assert first.returncode == 0, job_output(first)
    before = read_rows(run)
    lost = [n for n in ("c", "d") if cluster.node_down(n)]
    for name in lost:
        cluster.restart_node(name)
    job = cluster.submit(["python", "-m", "orchestration.cli.train", "--resume", run, "train.steps=5",
                          "rollout.replicas=1", "learner.resources.custom={node_c: 1}"])
    assert job.returncode == 0, job_output(job)
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5], [r["step"] for r in rows]
    assert rows[:3] == before, "a row written before the resume changed or was dropped"
    assert rows[3]["rollout/adapter_version"] == 4, "the resumed run did not continue from the checkpoint"
    summary = json.loads(uri.read_text(uri.join(run, "summary.json")))
    assert summary["placement"]["learner"].startswith(cluster.ips["c"] + " "), summary["placement"]
    assert engine_nodes(summary)[0] in (cluster.ips["c"], cluster.ips["d"]), summary["placement"]
    assert summary["steps"] == 5


def test_tinker_service_with_its_parts_on_other_nodes(cluster):
    """`aha tinker` as a Ray job: its driver on the head, the learner on b, its engine on c or d, checkpoints on the
    bucket; the official SDK, from outside the cluster, trains, samples and saves through it."""
    import re
    import time

    import httpx
    import tinker
    from tinker import types

    port, key, run = 18601, "tml-multinode", "gs://aha-runs/tinker"
    job = cluster.submit(["python", "-m", "orchestration.cli", "tinker", "--config", "configs/tinker_smollm2_cpu.yaml",
                          "--run-dir", run, "--host", "0.0.0.0", "--port", str(port), "--api-key", key,
                          "model.path=tiny-llama", "rollout.backend.max_lora_rank=16",
                          "rollout.backend.kv_cache_space_gb=1", ENGINES, "learner.resources.custom={node_b: 1}"],
                         wait=False, timeout_s=300)
    found = re.search(r"raysubmit_\w+", job.stdout + job.stderr)
    assert job.returncode == 0 and found, job_output(job)
    url = f"http://{cluster.ips['head']}:{port}"
    try:
        deadline, caps = time.monotonic() + 600, None
        while caps is None and time.monotonic() < deadline:
            try:
                reply = httpx.get(f"{url}/api/v1/get_server_capabilities", headers={"X-API-Key": key}, timeout=5)
                caps = reply.json() if reply.status_code == 200 else None
            except httpx.HTTPError:
                time.sleep(2)
        assert caps is not None, f"aha tinker did not come up at {url}"
        where = caps["placement"]
        assert where["driver"] == cluster.ips["head"] and where["learner"].startswith(cluster.ips["b"] + " "), where
        assert where["engines"][0].removeprefix("http://").rsplit(":", 1)[0] in (cluster.ips["c"], cluster.ips["d"])
        assert httpx.get(f"{url}/api/v1/get_server_capabilities", timeout=5).status_code == 401

        training = tinker.ServiceClient(base_url=url, api_key=key).create_lora_training_client(
            base_model="tiny-llama", rank=8, seed=0).result()
        tokens = list(range(40, 60))
        datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
        losses = []
        for _ in range(2):
            losses.append(training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"])
            training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        assert losses[1] < losses[0], losses
        sampled = training.save_weights_and_get_sampling_client().sample(
            types.ModelInput.from_ints(tokens[:5]), 2, types.SamplingParams(max_tokens=4, seed=1)).result()
        assert [len(s.tokens) for s in sampled.sequences] == [4, 4]
        path = training.save_state("one").result().path
        model_id = path.removeprefix("tinker://").split("/")[0]
        assert "one" in uri.list_names(uri.join(run, "tinker", model_id, "weights")), "the state is not on the bucket"
    finally:
        stopped = cluster.stop_job(found.group(0))
        assert stopped.returncode == 0, stopped.stderr[-2000:]
