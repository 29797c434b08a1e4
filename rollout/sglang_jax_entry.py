"""SGLang-JAX served through our rollout HTTP contract; run by the SGLang-JAX env's interpreter, never imported.

    $AHA_CACHE/envs/sglang_jax/bin/python rollout/sglang_jax_entry.py --model DIR --port P [--device cpu ...]

Why a wrapper instead of `sgl_jax.launch_server`: the stock server has no weight-update or LoRA endpoint (upstream
issue sgl-project/sglang-jax#873), and its OpenAI route ignores `seed` and answers in its own dialect. Here the
engine runs in this process (`enable_single_process=True`), which gives us its model, and a small FastAPI app
serves exactly what `rollout.client` and `SglangJaxBackend` speak:

- `GET /health`: 200 once the engine is built;
- `POST /v1/completions`: prompt as token ids, the sampling fields of `SamplingParams.to_payload()`, n samples;
  each choice carries `token_ids`, `logprobs.token_logprobs` (sampled-token logprob per token), `finish_reason`;
- `POST /v1/load_lora_adapter {lora_name, lora_path}`: the PEFT adapter in lora_path is merged into the base
  weights (W = W0 + alpha/r * B @ A, always from W0, so versions replace each other) and swapped into the running
  engine without recompiling; later requests name it with `model=lora_name`;
- `POST /v1/unload_lora_adapter {lora_name}`: back to the base weights (no-op for a name already replaced).

Only one set of weights is live, so a request for any other model name is refused (404) rather than answered
with the wrong weights. Parameters the engine does not apply are refused (400) here as well as on the driver.
Fixes the pinned sglang-jax needs here are applied at start-up (`compat_model_dir`, `apply_cpu_patches`), each
documented with its upstream cause and guarded by the version it was written for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger("sglang_jax_entry")

ENGINE = "sglang_jax"


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
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--deterministic-sampling", action="store_true")
    p.add_argument("--precompile", action="store_true")
    p.add_argument("--server-args-json", default="{}", help="extra sgl_jax ServerArgs fields, applied last")
    return p.parse_args(argv)


# ---- request translation (pure: unit-testable without the engine) -----------------------------------------------

def unsupported(body: dict[str, Any], deterministic: bool) -> str | None:
    """Why the request cannot be served as asked, or None."""
    if float(body.get("repetition_penalty", 1.0) or 1.0) != 1.0:
        return (f"{ENGINE} does not apply repetition_penalty ({body['repetition_penalty']}); set "
                "sampling.repetition_penalty to 1.0 or use presence/frequency_penalty")
    if body.get("seed") is not None and not deterministic:
        return (f"{ENGINE} ignores seed ({body['seed']}) unless started with deterministic sampling; set "
                "rollout.backend.deterministic_sampling: true or sampling.seed: null")
    return None


def sampling_params(body: dict[str, Any], index: int) -> dict[str, Any]:
    """SGLang-JAX sampling params of sample `index` of an OpenAI-style completions body."""
    params = {
        "max_new_tokens": int(body.get("max_tokens", 16)),
        "temperature": float(body.get("temperature", 1.0)),
        "top_p": float(body.get("top_p", 1.0)),
        "top_k": int(body.get("top_k", -1)),
        "min_p": float(body.get("min_p", 0.0)),
        "presence_penalty": float(body.get("presence_penalty", 0.0)),
        "frequency_penalty": float(body.get("frequency_penalty", 0.0)),
        "min_new_tokens": int(body.get("min_tokens", 0)),
        "stop": list(body.get("stop") or []) or None,
        "stop_token_ids": list(body.get("stop_token_ids") or []) or None,
        "ignore_eos": bool(body.get("ignore_eos", False)),
        "skip_special_tokens": bool(body.get("skip_special_tokens", True)),
        "n": 1,
    }
    if body.get("seed") is not None:
        # One seed per sample, so the n samples of a seeded request differ from each other but repeat across calls.
        params["sampling_seed"] = int(body["seed"]) + index
    return params


def choice(index: int, out: dict[str, Any], top_n: int) -> dict[str, Any]:
    """One OpenAI-style choice (plus `token_ids`, as vLLM's return_token_ids gives) from an engine output."""
    meta = out["meta_info"]
    token_lps = meta.get("output_token_logprobs") or []
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    top = None
    if top_n > 0:
        top = [{str(tid): float(lp) for lp, tid, _ in step} if step else None
               for step in meta.get("output_top_logprobs") or []]
    return {
        "index": index,
        "text": out.get("text", ""),
        "token_ids": [int(t) for t in out["output_ids"]],
        "logprobs": {"token_logprobs": [float(lp) for lp, _, _ in token_lps], "top_logprobs": top},
        "finish_reason": "length" if kind == "length" else "stop" if kind == "stop" else kind,
        "stop_reason": reason.get("matched") if isinstance(reason, dict) else None,
    }


# ---- start-up fixes -----------------------------------------------------------------------------------------------

def compat_model_dir(model: Path, out: Path) -> Path:
    """A folder view of `model` that transformers 4.55 (pinned by sglang-jax 0.0.2) reads as it was written.

    Our model folders are saved by transformers 5, which (1) names the tokenizer class `TokenizersBackend`, unknown
    to 4.55 ("Tokenizer class TokenizersBackend does not exist"), and (2) moves `rope_theta` into
    `rope_parameters`, so 4.55 would silently fall back to theta 10000 and generate from wrong positions. The view
    symlinks everything and rewrites only those two keys; a folder already in the old format passes through.
    """
    config = json.loads((model / "config.json").read_text())
    tok_path = model / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text()) if tok_path.exists() else {}
    rope = config.get("rope_parameters") or {}
    needs_rope = "rope_theta" not in config and "rope_theta" in rope
    needs_tok = tok.get("tokenizer_class") == "TokenizersBackend"
    if not (needs_rope or needs_tok):
        return model
    out.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        if item.name not in ("config.json", "tokenizer_config.json") and not (out / item.name).exists():
            (out / item.name).symlink_to(item.resolve())
    if needs_rope:
        config["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default":
            config["rope_scaling"] = rope
    (out / "config.json").write_text(json.dumps(config, indent=1))
    if needs_tok:
        tok["tokenizer_class"] = "PreTrainedTokenizerFast"
    if tok:
        (out / "tokenizer_config.json").write_text(json.dumps(tok, indent=1))
    return out


def apply_cpu_patches() -> list[str]:
    """Small fixes sglang-jax 0.0.2 needs on the JAX CPU backend; returns the names of those applied."""
    from importlib.metadata import version

    applied: list[str] = []
    if version("sglang-jax") != "0.0.2":  # written against 0.0.2 only; a newer release must be re-checked
        return applied
    _import_native_attention_once()
    applied.append("native-attention-pytree")
    return applied


def _import_native_attention_once() -> None:
    # Cause: `NativeAttention` subclasses `nnx.Module`, which flax 0.12 already registers as a pytree, and is also
    # decorated with `jax.tree_util.register_pytree_node_class`, so importing it raises "Duplicate custom PyTreeDef
    # type registration" (the TPU path never imports it). Import it once with a decorator that keeps the first
    # registration; nnx's flattening of a module holding only ints is equivalent. Scoped to this one import.
    import jax.tree_util as tree_util

    original = tree_util.register_pytree_node_class

    def register_once(cls):
        try:
            return original(cls)
        except ValueError as e:
            if "Duplicate custom PyTreeDef" not in str(e):
                raise
            return cls

    tree_util.register_pytree_node_class = register_once
    try:
        import sgl_jax.srt.layers.attention.native_backend  # noqa: F401
    finally:
        tree_util.register_pytree_node_class = original


# ---- server -----------------------------------------------------------------------------------------------------

def build_engine(args: argparse.Namespace):
    """The in-process SGLang-JAX engine, with our CPU fixes applied first."""
    applied = apply_cpu_patches()
    log.info("sgl_jax CPU patches applied: %s", applied or "none")
    from sgl_jax.srt.entrypoints.engine import Engine

    kwargs: dict[str, Any] = dict(
        model_path=str(args.model_dir), device=args.device, dtype=args.dtype, tp_size=args.tp_size,
        context_length=args.max_model_len, max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests, page_size=args.page_size, random_seed=args.random_seed,
        enable_deterministic_sampling=args.deterministic_sampling, enable_single_process=True,
        disable_jax_precompile=not args.precompile, skip_server_warmup=True, log_level="info",
        served_model_name=args.served_model_name,
    )
    if args.device == "cpu":
        # The default "fa" backend is a Pallas TPU kernel; "native" is the portable jnp path.
        kwargs.update(attention_backend="native", xla_backend="cpu")
    kwargs.update(json.loads(args.server_args_json))
    return Engine(**kwargs)


def build_app(engine, args: argparse.Namespace):
    """The FastAPI app around `engine`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    app = FastAPI()
    lora = MergedLora(engine, Path(args.model))
    state = {"model": args.served_model_name}  # the name of the weights that are live
    swap_lock = asyncio.Lock()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if body.get("model", args.served_model_name) != state["model"]:
            return error(404, f"model {body.get('model')!r} is not live; the engine serves {state['model']!r} "
                              "(one merged adapter at a time: load it first)")
        if (why := unsupported(body, args.deterministic_sampling)) is not None:
            return error(400, why)
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return error(400, "prompt must be one non-empty list of token ids")
        n, top_n = int(body.get("n", 1)), int(body.get("logprobs") or 0)
        if top_n > args.max_logprobs:
            return error(400, f"logprobs ({top_n}) exceeds the server's max_logprobs ({args.max_logprobs})")
        if len(prompt) + int(body.get("max_tokens", 16)) > args.max_model_len:
            return error(400, f"prompt ({len(prompt)} tokens) + max_tokens exceeds max_model_len "
                              f"({args.max_model_len})")
        outs = await engine.async_generate(
            input_ids=[list(prompt)] * n, sampling_params=[sampling_params(body, i) for i in range(n)],
            return_logprob=[True] * n, top_logprobs_num=[top_n] * n)
        outs = outs if isinstance(outs, list) else [outs]
        choices = [choice(i, o, top_n) for i, o in enumerate(outs)]
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": state["model"], "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                          "total_tokens": len(prompt) + completion_tokens}}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error(400, "load_lora_adapter needs lora_name and lora_path")
        async with swap_lock:
            try:
                seconds = await asyncio.to_thread(lora.load, Path(path))
            except (ValueError, FileNotFoundError) as e:
                return error(400, f"cannot merge adapter {name!r} from {path}: {e}")
            await engine.tokenizer_manager.flush_cache()  # cached prefixes were computed with the old weights
            state["model"] = name
        log.info("adapter %s merged and live in %.3f s", name, seconds)
        return {"status": "ok", "lora_name": name, "merge_s": seconds}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        name = (await request.json()).get("lora_name")
        async with swap_lock:
            if name != state["model"]:  # already replaced by a newer version: nothing of it is live
                return {"status": "ok", "lora_name": name, "live": state["model"]}
            await asyncio.to_thread(lora.restore_base)
            await engine.tokenizer_manager.flush_cache()
            state["model"] = args.served_model_name
        return {"status": "ok", "lora_name": name, "live": state["model"]}

    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    args.model_dir = compat_model_dir(Path(args.model), Path(args.workdir) / "model-view")
    t0 = time.perf_counter()
    engine = build_engine(args)
    log.info("engine ready in %.1f s", time.perf_counter() - t0)
    app = build_app(engine, args)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", loop="uvloop")


if __name__ == "__main__":
    main()
