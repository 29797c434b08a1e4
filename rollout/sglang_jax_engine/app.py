"""The in-process SGLang-JAX engine and the FastAPI app that serves our rollout contract around it.

No `from __future__ import annotations` here: FastAPI reads the route functions' annotations at runtime, and with
postponed (string) annotations the locally imported `Request` would not resolve, so it became a query field (422).
"""

import argparse
import asyncio
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from rollout.engine_ext.aha_engine_key import KEY_ENV, RequireKey
from rollout.sglang_jax_engine.lora_merge import MergedLora
from rollout.sglang_jax_engine.patches import apply_cpu_patches
from rollout.sglang_jax_engine.wire import choice, sampling_params, unsupported

log = logging.getLogger(__name__)


def kv_cache_tokens(model_dir: Path, gib: float, dtype: str) -> int:
    """Tokens a KV cache of `gib` GiB holds for this model (keys and values of every layer)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    width = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)
    return int(gib * 2**30) // (2 * cfg["num_hidden_layers"] * kv_heads * head_dim * width)


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
    # The overlap scheduler hands prefill logprobs on as a list where the logprob bookkeeping asserts a tuple
    # (0.0.2: AssertionError in add_input_logprob_return_values); the plain scheduler converts them. On a CPU the
    # overlap of scheduling with compute gains little anyway.
    kwargs["disable_overlap_schedule"] = True
    # Prefix (radix) caching would serve prompt states computed with the previous weights after a LoRA merge, and
    # 0.0.2 cannot flush it (its scheduler has no handler for FlushCacheReqInput, and the tokenizer manager builds
    # that request without its required request_id). Without it, every request prefills with the live weights.
    kwargs["disable_radix_cache"] = True
    kwargs.update(json.loads(args.server_args_json))
    return Engine(**kwargs)


class Refused(Exception):
    """A request answered with an OpenAI-style error: `status` and the message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def usage(prompt: list[int], choices: list[dict]) -> dict:
    """The OpenAI `usage` block of a response."""
    completion_tokens = sum(len(c["token_ids"]) for c in choices)
    return {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
            "total_tokens": len(prompt) + completion_tokens}


class EngineServer:
    """Our rollout contract around one in-process engine. One set of weights is live at a time: the base model or
    one merged adapter, named `live`; a request for any other name is refused rather than answered wrongly."""

    def __init__(self, engine, args: argparse.Namespace):
        self.engine, self.args = engine, args
        self.lora = MergedLora(engine, Path(args.model))
        self.live = args.served_model_name
        self.swap_lock = asyncio.Lock()  # one merge or unmerge at a time
        self._tokenizer = None
        if getattr(args, "adapter_path", None):
            seconds = self.lora.load(Path(args.adapter_path))
            self.live = args.adapter_name or args.served_model_name
            log.info("adapter %s merged at start-up in %.3f s", self.live, seconds)

    @property
    def tokenizer(self) -> Any:
        """Loaded on the first text or chat request (the training client sends token ids)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.args.model_dir)  # the view transformers 4.55 reads
        return self._tokenizer

    async def generate(self, body: dict, prompt: list[int]) -> list[dict]:
        """The choices of `prompt`'s n samples as `body` asks; Refused for what cannot be served as asked."""
        args = self.args
        if body.get("model", args.served_model_name) != self.live:
            raise Refused(404, f"model {body.get('model')!r} is not live; the engine serves {self.live!r} "
                               "(one merged adapter at a time: load it first)")
        if (why := unsupported(body, args.deterministic_sampling)) is not None:
            raise Refused(400, why)
        n, top_n = int(body.get("n", 1)), int(body.get("logprobs") or 0)
        if top_n > args.max_logprobs:
            raise Refused(400, f"logprobs ({top_n}) exceeds the server's max_logprobs ({args.max_logprobs})")
        if len(prompt) + int(body.get("max_tokens", 16)) > args.max_model_len:
            raise Refused(400, f"prompt ({len(prompt)} tokens) + max_tokens exceeds max_model_len "
                               f"({args.max_model_len})")
        outs = await self.engine.async_generate(
            input_ids=[list(prompt)] * n, sampling_params=[sampling_params(body, i) for i in range(n)],
            return_logprob=[True] * n, top_logprobs_num=[top_n] * n)
        outs = outs if isinstance(outs, list) else [outs]
        return [choice(i, o, top_n) for i, o in enumerate(outs)]

    async def completions(self, body: dict) -> dict:
        """POST /v1/completions: a prompt as token ids (or one string)."""
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            prompt = self.tokenizer(prompt)["input_ids"]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise Refused(400, "prompt must be one non-empty string or list of token ids")
        choices = await self.generate(body, prompt)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.live, "choices": choices, "usage": usage(prompt, choices)}

    async def chat_completions(self, body: dict) -> dict:
        """POST /v1/chat/completions: messages rendered with the model's chat template; no logprobs."""
        messages = body.pop("messages", None)
        if not (isinstance(messages, list) and messages):
            raise Refused(400, "messages must be a non-empty list of {role, content}")
        if body.pop("logprobs", None) or body.pop("top_logprobs", None):
            raise Refused(400, "chat logprobs are not served here; ask /v1/completions with token ids")
        if "max_completion_tokens" in body:  # the newer OpenAI name
            body["max_tokens"] = body.pop("max_completion_tokens")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = self.tokenizer(text, add_special_tokens=False)["input_ids"]  # the template has the special tokens
        choices = await self.generate(body, prompt)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.live, "usage": usage(prompt, choices),
                "choices": [{"index": c["index"], "message": {"role": "assistant", "content": c["text"]},
                             "finish_reason": c["finish_reason"]} for c in choices]}

    async def load_lora_adapter(self, body: dict) -> dict:
        """POST /v1/load_lora_adapter: merge the adapter into W0 and make it live under its name."""
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            raise Refused(400, "load_lora_adapter needs lora_name and lora_path")
        async with self.swap_lock:
            try:
                seconds = await asyncio.to_thread(self.lora.load, Path(path))
            except (ValueError, FileNotFoundError, KeyError) as e:
                raise Refused(400, f"cannot merge adapter {name!r} from {path}: {e}") from None
            self.live = name
        log.info("adapter %s merged and live in %.3f s", name, seconds)
        return {"status": "ok", "lora_name": name, "merge_s": seconds}

    async def unload_lora_adapter(self, body: dict) -> dict:
        """POST /v1/unload_lora_adapter: back to the base weights, if that adapter is the live one."""
        name = body.get("lora_name")
        async with self.swap_lock:
            if name == self.live:  # else already replaced by a newer version: nothing of it is live
                await asyncio.to_thread(self.lora.restore_base)
                self.live = self.args.served_model_name
        return {"status": "ok", "lora_name": name, "live": self.live}


def build_app(engine, args: argparse.Namespace):
    """The FastAPI app around `engine`: each route hands its JSON body to an `EngineServer` method; with
    --adapter-path that adapter is merged before it answers; with $AHA_ENGINE_KEY set, every route but /health
    needs that key."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    server = EngineServer(engine, args)
    app = FastAPI()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)

    if os.environ.get(KEY_ENV):  # every route but /health, the docs and /openapi.json included
        app.add_middleware(RequireKey)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    def json_route(handler):
        async def answer(request: Request):
            try:
                return await handler(await request.json())
            except Refused as refused:
                return error(refused.status, str(refused))
        return answer

    for path, handler in (("/v1/completions", server.completions), ("/v1/chat/completions", server.chat_completions),
                          ("/v1/load_lora_adapter", server.load_lora_adapter),
                          ("/v1/unload_lora_adapter", server.unload_lora_adapter)):
        app.post(path)(json_route(handler))
    return app
