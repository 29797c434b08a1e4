"""Tenant scaling: 1, 2 and 4 Tinker clients running the same loops at once against one `aha tinker`, in one run.

    .venv/bin/python bench/bench_tenants.py [--clients 1 2 4] [--rounds 3] [--config configs/tinker_smollm2_cpu.yaml]

Each client (LoRA rank 16, the official SDK) runs, in its own thread:
- SFT: `--rounds` of forward_backward (8 datums of 64 tokens, cross_entropy) + optim_step;
- RL: `--rounds` of sampling 2 prompts x 4 completions of up to 32 tokens from its newest sampler, then
  forward_backward (importance_sampling on what it sampled) + optim_step + save_weights_and_get_sampling_client.
Printed per client count: aggregate SFT datums/s and RL sampled tokens/s, each as a ratio to one client in the same
run, and how many requests the server's learner passes carried (its log's "learner pass of N clients" lines). Every
count runs one warm-up round first (the programs of its shapes), not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATUMS, LENGTH, PROMPTS, SAMPLES, MAX_TOKENS = 8, 64, 2, 4, 32


def start_server(config: Path, run_dir: Path) -> tuple[subprocess.Popen, str, str, Path]:
    log = run_dir / "server.log"
    cmd = [sys.executable, "-m", "orchestration.cli", "tinker", "--config", str(config), "--run-dir", str(run_dir),
           "--port", "0"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    info = run_dir / "tinker.json"
    while not info.exists():
        if proc.poll() is not None:
            raise SystemExit(f"aha tinker exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    found = json.loads(info.read_text())
    return proc, found["base_url"], found["api_key"], log


def sft_round(client, datums) -> int:
    client.forward_backward(datums, "cross_entropy").result()
    client.optim_step(adam()).result()
    return len(datums)


def rl_round(state: dict, prompts) -> int:
    from tinker import types

    client, sampler = state["client"], state["sampler"]
    params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
    futures = [sampler.sample(p, SAMPLES, params) for p in prompts]
    datums, sampled = [], 0
    for prompt, future in zip(prompts, futures):
        for seq in future.result().sequences:
            if not seq.tokens:
                continue
            sampled += len(seq.tokens)
            tokens = prompt.to_ints() + list(seq.tokens)
            n = len(tokens) - 1
            lps = [0.0] * (prompt.length - 1) + list(seq.logprobs)
            adv = [0.0] * (prompt.length - 1) + [1.0] * len(seq.tokens)
            datums.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                      loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": lps[:n],
                                                      "advantages": adv[:n]}))
    client.forward_backward(datums, "importance_sampling").result()
    client.optim_step(adam()).result()
    state["sampler"] = client.save_weights_and_get_sampling_client()
    return sampled


def adam():
    from tinker import types

    return types.AdamParams(learning_rate=1e-4)


def concurrently(work, states: list, rounds: int) -> tuple[float, int]:
    """(wall seconds, units done) of `rounds` of `work(state)` in one thread per state."""
    done = [0] * len(states)

    def run(i: int) -> None:
        for _ in range(rounds):
            done[i] += work(states[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(states))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, sum(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tinker_smollm2_cpu.yaml")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import tinker
    from tinker import types

    rng = np.random.default_rng(0)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    proc, base_url, key, log = start_server(args.config, run_dir)
    rows = []
    try:
        service = tinker.ServiceClient(base_url=base_url, api_key=key)
        base = service.get_server_capabilities().supported_models[0].model_name
        for n in args.clients:
            clients = [service.create_lora_training_client(base_model=base, rank=16, seed=i).result() for i in range(n)]
            sft = [[types.Datum(model_input=types.ModelInput.from_ints(t[:-1].tolist()),
                                loss_fn_inputs={"target_tokens": t[1:].tolist(), "weights": [1.0] * (LENGTH - 1)})
                    for t in rng.integers(100, 20000, (DATUMS, LENGTH))] for _ in clients]
            prompts = [types.ModelInput.from_ints(rng.integers(100, 20000, 24).tolist()) for _ in range(PROMPTS)]
            states = [{"client": c, "sampler": c.save_weights_and_get_sampling_client()} for c in clients]
            work_sft = lambda i: sft_round(clients[i], sft[i])  # noqa: E731
            concurrently(work_sft, list(range(n)), 1)  # warm-up: this count's shapes
            passes_before = log.read_text().count("learner pass of")
            sft_s, datums = concurrently(work_sft, list(range(n)), args.rounds)
            concurrently(lambda s: rl_round(s, prompts), states, 1)
            rl_s, tokens = concurrently(lambda s: rl_round(s, prompts), states, args.rounds)
            shared = log.read_text().count("learner pass of") - passes_before
            rows.append((n, datums / sft_s, tokens / rl_s, shared))
            print(f"{n} clients: SFT {datums / sft_s:.2f} datums/s, RL {tokens / rl_s:.1f} sampled tokens/s, "
                  f"{shared} shared learner passes", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    one = rows[0]
    print("\n| clients | SFT datums/s | vs 1 | RL sampled tokens/s | vs 1 | shared passes |\n|---|---|---|---|---|---|")
    for n, sft, rl, shared in rows:
        print(f"| {n} | {sft:.2f} | {sft / one[1]:.2f} | {rl:.1f} | {rl / one[2]:.2f} | {shared} |")


if __name__ == "__main__":
    main()
