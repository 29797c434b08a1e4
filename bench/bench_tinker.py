"""One forward_backward + optim_step round trip through the Tinker API (the official SDK, HTTP, protobuf, futures)
against the same update through the learner handle, as `aha train` makes its updates, in one run on one learner.

    .venv/bin/python bench/bench_tinker.py [--model smollm2-135m-instruct] [--rounds 5]

Both paths update a LoRA of the same rank on the same batch (32 sequences of a 64-token prompt and a 16-token
completion, the demo's step shape) with the importance_sampling loss; they alternate, after two warm-up rounds
each (the compiles). The ratio API / handle is the service's overhead (target <= 1.1); API / GRPO is a client's
update against the same update inside `aha train` (the GRPO loss on the same sequences, kl_beta 0, prompt sharing
on; target <= 1.1).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestration.config.files import load_config  # noqa: E402
from orchestration.config.schema import ServiceConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROWS, PROMPT, COMPLETION, GROUP = 32, 64, 16, 8


def serve_in_thread(app, port: int) -> None:
    from aiohttp import web

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    threading.Thread(target=lambda: asyncio.run(run()), daemon=True).start()


def batches(rng: np.random.Generator):
    """(TokenBatch, TrainBatch, SDK datums) of the same sequences."""
    from tinker import types

    from learner.batch import TrainBatch
    from learner.token_batch import TokenBatch

    prompts = [list(rng.integers(3, 40000, PROMPT)) for _ in range(ROWS // GROUP)]
    rows = [(prompts[i // GROUP], list(rng.integers(3, 40000, COMPLETION))) for i in range(ROWS)]
    lps = [list(-rng.random(COMPLETION) - 0.5) for _ in rows]
    advs = rng.standard_normal(ROWS)
    tokens = [[int(t) for t in p + c] for p, c in rows]
    inputs = [{"logprobs": np.array([0.0] * (PROMPT - 1) + lp, np.float32),
               "advantages": np.array([0.0] * (PROMPT - 1) + [a] * COMPLETION, np.float32)}
              for lp, a in zip(lps, advs)]
    token_batch = TokenBatch([t[:-1] for t in tokens], [t[1:] for t in tokens], inputs)
    grpo = TrainBatch([p for p, _ in rows], [c for _, c in rows], lps, advs.astype(np.float32),
                      np.repeat(np.arange(ROWS // GROUP), GROUP))
    datums = [types.Datum(model_input=types.ModelInput.from_ints(t[:-1]),
                          loss_fn_inputs={"target_tokens": t[1:], **{k: v.tolist() for k, v in i.items()}})
              for t, i in zip(tokens, inputs)]
    return token_batch, grpo, datums


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    cfg = load_config(ROOT / "configs" / "tinker_smollm2_cpu.yaml",
                      [f"model.path={args.model}", "learner.grpo.micro_batch_size=32", "learner.lora.rank=16"],
                      ServiceConfig)
    import tinker
    from tinker import types

    from learner.adapter_api import AdamParams
    from learner.config import LoraConfig
    from orchestration.cluster import launch
    from orchestration.service.app import TinkerApp
    from orchestration.service.training import TinkerService

    started = launch.connect(cfg)
    learner = launch.start_learner(cfg, None)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        key = "tml-bench"
        serve_in_thread(TinkerApp(TinkerService(cfg, learner, None, tempfile.mkdtemp()), key).build(), port)
        time.sleep(1.0)
        client = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key=key)
        training = client.create_lora_training_client(base_model=args.model, rank=16, seed=0).result()
        learner.add_adapter("direct", LoraConfig(rank=16, alpha=32.0), 0).result()
        token_batch, grpo, datums = batches(np.random.default_rng(0))
        adam = AdamParams(learning_rate=1e-5)

        def api() -> None:
            training.forward_backward(datums, "importance_sampling")
            training.optim_step(types.AdamParams(learning_rate=1e-5)).result()

        def handle() -> None:
            learner.forward_backward(token_batch, "importance_sampling", "direct")
            learner.optim_step("direct", adam).result()

        def grpo_step() -> None:
            learner.forward_backward(grpo, "grpo")
            learner.optim_step().result()

        timed = {"api": api, "handle": handle, "grpo": grpo_step}
        for fn in timed.values():  # compiles
            fn()
            fn()
        seconds: dict[str, list[float]] = {name: [] for name in timed}
        for r in range(args.rounds):
            for name, fn in timed.items():
                t0 = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - t0)
            print(f"round {r + 1}: " + ", ".join(f"{n} {s[-1]:.3f} s" for n, s in seconds.items()), flush=True)
        med = {name: statistics.median(s) for name, s in seconds.items()}
        print(f"median forward_backward + optim_step: API {med['api']:.3f} s, handle {med['handle']:.3f} s, GRPO "
              f"(prompt sharing) {med['grpo']:.3f} s; API / handle {med['api'] / med['handle']:.3f}, API / GRPO "
              f"{med['api'] / med['grpo']:.3f} (targets <= 1.1)")
    finally:
        learner.kill()
        if started:
            launch.disconnect()


if __name__ == "__main__":
    main()
