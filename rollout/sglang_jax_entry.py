"""SGLang-JAX served through our rollout HTTP contract; a program for the SGLang-JAX env's interpreter.

    $AHA_CACHE/envs/sglang_jax/bin/python -P rollout/sglang_jax_entry.py --model DIR --port P [--device cpu ...]

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
documented with its upstream cause and guarded by the version it was written for. Module level imports only the
standard library (engine imports happen inside functions), so tests import the pure helpers from the learner env.
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
    p.add_argument("--kv-cache-gb", type=float, default=None, help="KV cache GiB; overrides --max-total-tokens")
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

# Request fields the wrapper understands: SamplingParams.to_payload() plus the client's own keys and the one vLLM
# extra our configs use. Anything else is refused rather than silently dropped.
KNOWN_FIELDS = frozenset({
    "model", "prompt", "stream", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "stop", "stop_token_ids", "seed", "n", "max_tokens", "min_tokens", "logprobs", "ignore_eos",
    "skip_special_tokens", "include_stop_str_in_output",
})


def unsupported(body: dict[str, Any], deterministic: bool) -> str | None:
    """Why the request cannot be served as asked, or None."""
    if unknown := sorted(set(body) - KNOWN_FIELDS):
        return f"{ENGINE} does not support request field(s) {unknown}; remove them (e.g. from sampling.extra)"
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
        "no_stop_trim": bool(body.get("include_stop_str_in_output", False)),
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
        # Ids from the logprob entries, one per sampled token: `output_ids` comes from the incremental detokenizer,
        # which drops special tokens when skip_special_tokens is set.
        "token_ids": [int(tid) for _, tid, _ in token_lps],
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
    _load_weights_unpadded_off_tpu()
    applied.append("weight-loader-head-dim")
    _pad_prefill_logits_with_logprobs()
    applied.append("prefill-logprob-padding")
    _min_p_filter_two_operands()
    applied.append("min-p-operands")
    _return_sampled_logprobs()
    applied.append("sampled-logprobs")
    _stop_token_ids_despite_ignore_eos()
    applied.append("stop-token-ids-with-ignore-eos")
    import jax

    if jax.default_backend() != "tpu":
        _seeded_sampling_from_probs()
        applied.append("seeded-sampling-probs")
    return applied


def _seeded_sampling_from_probs() -> None:
    # Cause: off TPU the sampler hands *probabilities* (after top-k/top-p) to `multinomial_with_seed`, which
    # applies softmax as if they were logits, so seeded (deterministic) sampling draws from a near-uniform
    # distribution. Hand it log-probabilities: softmax(log p) = p. The unseeded path already takes log(p).
    import jax.numpy as jnp
    from sgl_jax.srt.layers import sampler

    original = sampler.multinomial_with_seed

    def seeded(operands):
        probs, seed, positions, rng = operands
        return original((jnp.log(probs), seed, positions, rng))

    sampler.multinomial_with_seed = seeded


def _stop_token_ids_despite_ignore_eos() -> None:
    # Not a CPU bug but a contract difference: `Req.check_finished` skips stop_token_ids when ignore_eos is set,
    # while our SamplingParams (as vLLM) ignores only the model's eos. Finish on a requested stop token anyway.
    from sgl_jax.srt.managers.schedule_batch import FINISH_MATCHED_TOKEN, Req

    original = Req.check_finished

    def check_finished(self):
        original(self)
        params = self.sampling_params
        if (not self.finished() and params.ignore_eos and params.stop_token_ids and self.output_ids
                and int(self.output_ids[-1]) in params.stop_token_ids):
            self.finished_reason = FINISH_MATCHED_TOKEN(matched=int(self.output_ids[-1]))

    Req.check_finished = check_finished


def _return_sampled_logprobs() -> None:
    # Cause: `Sampler` writes the logprobs onto `logits_output` inside a `lax.cond` branch of the jitted sampler,
    # so they never leave the trace and `next_token_logprobs` stays None: with return_logprob the scheduler fails
    # with "'NoneType' object is not subscriptable"; with top logprobs that branch even fails to trace
    # ("tolist() method was called on traced array"). Turn the branch off and compute the logprobs after sampling
    # from the same logits, penalties and temperature (greedy rows have temperature 1: raw logprobs).
    import jax
    import jax.numpy as jnp
    from sgl_jax.srt.layers.sampler import Sampler, get_top_logprobs
    from sgl_jax.srt.model_executor.model_runner import ModelRunner

    Sampler._process_logprob_results = lambda self, operands: None

    @jax.jit
    def tempered_logprobs(logits, temperatures, penalty, ids):
        logits = logits.reshape(-1, logits.shape[-1]).astype(jnp.float32)
        if penalty is not None:
            logits = logits + penalty.astype(jnp.float32)
        logprobs = jax.nn.log_softmax(logits / temperatures.reshape(-1, 1).astype(jnp.float32), axis=-1)
        return logprobs, logprobs[jnp.arange(ids.shape[0]), ids]

    original_sample = ModelRunner.sample

    def sample_with_logprobs(self, logits_output, sampling_metadata, positions):
        ids = original_sample(self, logits_output, sampling_metadata, positions)
        if sampling_metadata.return_logprob:
            penalty = sampling_metadata.linear_penalty if sampling_metadata.do_penalties else None
            logprobs, chosen = tempered_logprobs(logits_output.next_token_logits, sampling_metadata.temperatures,
                                                 penalty, ids)
            logits_output.next_token_logprobs = chosen
            nums = sampling_metadata.top_logprobs_nums
            if nums is not None and any(k > 0 for k in nums):
                (logits_output.next_token_top_logprobs_val,
                 logits_output.next_token_top_logprobs_idx) = get_top_logprobs(logprobs, nums)
        return ids

    ModelRunner.sample = sample_with_logprobs


def _min_p_filter_two_operands() -> None:
    # Cause: the non-TPU sampling path passes (probs, min_ps, False) to `_apply_min_p_filter`, which unpacks two
    # values: "too many values to unpack (expected 2)" on every sampled (temperature > 0) step. Drop the third.
    from sgl_jax.srt.layers import sampler

    original = sampler._apply_min_p_filter
    sampler._apply_min_p_filter = lambda operands: original(tuple(operands[:2]))


def _pad_prefill_logits_with_logprobs() -> None:
    # Two causes in `LogitsProcessor` when a prefill asks for logprobs:
    # 1. it builds the logits in a loop that stops at the first padded sequence (extend_len == 0), so it returns
    #    real_bs rows while the sampler's per-row arrays have the padded batch size: "Temperature batch size 8
    #    doesn't match logits batch size 1". Pad the rows back (padded rows are discarded, as without logprobs).
    # 2. with top logprobs it computes the prompt's top-k inside the jitted forward with `.tolist()`:
    #    "ConcretizationTypeError ... The tolist() method was called on traced array". We never ask for prompt
    #    top-k (the completion's top-k is computed after sampling), so skip it and hand the bookkeeping empty
    #    entries of the shape it expects (one per pruned prompt position).
    import jax.numpy as jnp
    from sgl_jax.srt.layers.logits_processor import LogitsProcessor

    original_call = LogitsProcessor.__call__

    def call_padded(self, hidden_states, lm_head, logits_metadata):
        extend = logits_metadata.forward_mode.is_extend()
        skip_top = extend and logits_metadata.extend_return_top_logprob
        logits_metadata.extend_return_top_logprob = False if skip_top else logits_metadata.extend_return_top_logprob
        try:
            out = original_call(self, hidden_states, lm_head, logits_metadata)
        finally:
            logits_metadata.extend_return_top_logprob |= skip_top
        if skip_top:
            pruned = [n for n in logits_metadata.extend_logprob_pruned_lens_cpu or []]
            out.input_top_logprobs_val = [[[] for _ in range(n)] for n in pruned]
            out.input_top_logprobs_idx = [[[] for _ in range(n)] for n in pruned]
        lens = logits_metadata.extend_seq_lens_cpu
        if extend and lens and out.next_token_logits.shape[0] < len(lens):
            missing = len(lens) - out.next_token_logits.shape[0]
            out.next_token_logits = jnp.pad(out.next_token_logits, ((0, missing), (0, 0)))
        return out

    LogitsProcessor.__call__ = call_padded


def _load_weights_unpadded_off_tpu() -> None:
    # Cause: `WeightLoader` pads head_dim to a multiple of 128 (a TPU kernel layout) while the model's layers and
    # the KV cache keep the checkpoint's head_dim. With head_dim 64 (SmolLM2, tiny-llama) k_proj then yields twice
    # the tokens and the first forward fails with "Incompatible shapes for broadcasting: (128, 2, 64) and requested
    # shape (64, 2, 64)". Off TPU, load the weights unpadded, as the layers expect.
    import jax
    from sgl_jax.srt.utils.weight_utils import WeightLoader

    original_init = WeightLoader.__init__

    def init_unpadded(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if jax.default_backend() != "tpu":
            self.head_dim, self.head_dim_pad = self.head_dim_original, 0

    WeightLoader.__init__ = init_unpadded


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


# ---- LoRA merged into the running engine ------------------------------------------------------------------------

def peft_target(name: str) -> tuple[str, str]:
    """(HF weight name, "A" or "B") of a PEFT tensor name (base_model.model.model.layers.0.mlp.up_proj.lora_A...)."""
    stem = name.removeprefix("base_model.model.")
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if stem.endswith(suffix):
            return stem[: -len(suffix)] + ".weight", part
    raise ValueError(f"{name} is not a PEFT LoRA tensor (expected ...lora_A.weight / ...lora_B.weight)")


def merged_deltas(tensors: dict[str, Any], adapter_config: dict[str, Any]) -> dict[str, Any]:
    """{HF weight name: scale * B @ A} (HF layout [out, in], float32) of a PEFT adapter."""
    import numpy as np

    rank = int(adapter_config["r"])
    alpha = float(adapter_config.get("lora_alpha", rank))
    scale = alpha / (rank ** 0.5 if adapter_config.get("use_rslora") else rank)
    pairs: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        target, part = peft_target(name)
        pairs.setdefault(target, {})[part] = np.asarray(tensor, dtype=np.float32)
    if missing := sorted(t for t, ab in pairs.items() if set(ab) != {"A", "B"}):
        raise ValueError(f"adapter lacks lora_A or lora_B for {missing[:3]}")
    return {target: scale * (ab["B"] @ ab["A"]) for target, ab in pairs.items()}


class MergedLora:
    """Swaps base + LoRA weights into the engine's jitted forward (same shapes and shardings: no recompile)."""

    def __init__(self, engine, model_dir: Path):
        self.runner = engine.scheduler_info["scheduler"].tp_worker.worker.model_runner
        self.model_dir = model_dir
        self.model = self.runner.model
        self.mappings = self._weight_mappings()
        self.base: dict[str, Any] = {}  # HF name -> base weight (numpy), read once from the checkpoint
        self.merged: set[str] = set()  # HF names whose live value is not the base weight

    def _weight_mappings(self) -> dict[str, Any]:
        # Every sgl_jax model class builds its HF-name -> parameter mapping in a `_create_*weight_mappings` method.
        names = [n for n in dir(self.model) if n.startswith("_create_") and n.endswith("weight_mappings")]
        if not names:
            raise RuntimeError(f"{type(self.model).__name__} has no _create_*weight_mappings method; this "
                               "sglang-jax version is not supported by the LoRA merge")
        return getattr(self.model, names[0])()

    def _base_weight(self, name: str):
        if name not in self.base:
            from safetensors import safe_open

            for file in sorted(self.model_dir.glob("*.safetensors")):
                with safe_open(str(file), framework="numpy") as f:
                    if name in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                        self.base[name] = f.get_tensor(name).astype("float32")
                        break
            else:
                raise ValueError(f"base weight {name} not found in {self.model_dir}")
        return self.base[name]

    def load(self, adapter_dir: Path) -> float:
        """Make base + this adapter live (replacing any previous adapter); return the seconds it took."""
        from safetensors.numpy import load_file

        t0 = time.perf_counter()
        config = json.loads((adapter_dir / "adapter_config.json").read_text())
        deltas = merged_deltas(load_file(str(adapter_dir / "adapter_model.safetensors")), config)
        if unknown := sorted(set(deltas) - set(self.mappings)):
            raise ValueError(f"adapter targets weights the engine does not have: {unknown[:3]}")
        values = {name: self._base_weight(name) + delta for name, delta in deltas.items()}
        values.update({name: self._base_weight(name) for name in self.merged - set(deltas)})
        self._assign(values)
        self.merged = set(deltas)
        return time.perf_counter() - t0

    def restore_base(self) -> None:
        """Make the base weights live again."""
        self._assign({name: self._base_weight(name) for name in self.merged})
        self.merged = set()

    def _assign(self, values: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp
        from flax import nnx
        from sgl_jax.srt.utils.weight_utils import WeightLoader

        # The engine's own loader turns an HF weight into the parameter (transpose, padding, sharding), so the new
        # arrays match the compiled forward exactly.
        config = self.runner.model_config
        loader = WeightLoader(self.model, config, self.runner.mesh, dtype=config.dtype)
        params = nnx.state(self.model)
        for name, value in values.items():
            loader._process_and_assign_weight(params, name, jnp.asarray(value), self.mappings[name])
        nnx.update(self.model, params)
        leaves = jax.tree_util.tree_leaves(nnx.split(self.model)[1])
        self._swap_leaves(leaves)

    def _swap_leaves(self, leaves: list) -> None:
        # sglang-jax 0.0.2 keeps the flattened model state in a closure of `jitted_run_model` (later versions
        # expose `model_runner.model_state_leaves`); replacing it in place keeps the compiled executables.
        runner = self.runner
        if hasattr(runner, "model_state_leaves"):
            old, put = runner.model_state_leaves, lambda new: setattr(runner, "model_state_leaves", new)
        else:
            fn = runner.jitted_run_model
            cell = fn.__closure__[fn.__code__.co_freevars.index("model_state_leaves")]
            old, put = cell.cell_contents, lambda new: setattr(cell, "cell_contents", new)
        if len(old) != len(leaves) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(old, leaves)):
            raise RuntimeError("merged weights do not match the compiled model's parameter shapes; "
                               "the LoRA merge does not support this model/sglang-jax version")
        put(leaves)


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
            except (ValueError, FileNotFoundError, KeyError) as e:
                return error(400, f"cannot merge adapter {name!r} from {path}: {e}")
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
            state["model"] = args.served_model_name
        return {"status": "ok", "lora_name": name, "live": state["model"]}

    return app


def die_with_parent() -> None:
    """SIGTERM this server when the process that started it dies (Ray kills actors with SIGKILL)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def main(argv: list[str] | None = None) -> None:
    die_with_parent()
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
