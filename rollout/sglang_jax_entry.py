"""SGLang-JAX served through our rollout HTTP contract: the program the SGLang-JAX env's interpreter runs.

    $AHA_CACHE/envs/sglang_jax/bin/python -P rollout/sglang_jax_entry.py --model DIR --port P [--device cpu ...]

What it serves and why it wraps the engine instead of `sgl_jax.launch_server`: rollout/sglang_jax_engine/__init__.py.
`-P` keeps rollout/ itself off sys.path; the repository root goes on it instead, so the engine modules import as
`rollout.sglang_jax_engine.*`. With $AHA_ENGINE_KEY set, every route but /health requires it as a bearer token
(rollout/engine_ext/aha_engine_key.py); the key is never on the command line.
"""

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.affinity import pin_process  # noqa: E402
from rollout.engine_launcher import die_with_parent  # noqa: E402
from rollout.sglang_jax_engine.app import build_app, build_engine, kv_cache_tokens  # noqa: E402
from rollout.sglang_jax_engine.patches import compat_model_dir  # noqa: E402

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF model folder (safetensors + config + tokenizer)")
    p.add_argument("--workdir", default=".", help="where the model view (if any) is written")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", default="base")
    p.add_argument("--device", default="cpu", choices=["cpu", "tpu", "gpu"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--kv-cache-gb", type=float, default=None, help="KV cache GiB; overrides --max-total-tokens")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--deterministic-sampling", action="store_true")
    p.add_argument("--precompile", action="store_true")
    p.add_argument("--server-args-json", default="{}", help="extra sgl_jax ServerArgs fields, applied last")
    p.add_argument("--adapter-name", help="serve this PEFT adapter (--adapter-path), merged at start, by this name")
    p.add_argument("--adapter-path", help="PEFT adapter folder merged before the server answers")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    die_with_parent()
    if cores := os.environ.get("AHA_CPU_CORES"):  # rollout.backend.cpu_cores: every thread the imports started too
        pin_process(int(c) for c in cores.split(","))
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    args.model_dir = compat_model_dir(Path(args.model), Path(args.workdir) / "model-view")
    if args.kv_cache_gb is not None:
        args.max_total_tokens = kv_cache_tokens(args.model_dir, args.kv_cache_gb, args.dtype)
    t0 = time.perf_counter()
    engine = build_engine(args)
    log.info("engine ready in %.1f s", time.perf_counter() - t0)
    app = build_app(engine, args)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", loop="uvloop")


if __name__ == "__main__":
    main()
