"""Start-up fixes the pinned sglang-jax (0.0.2) needs on CPU; each names its upstream cause. Another sglang-jax is
refused with one line (common/pins.py); docs/patches.md lists them with what would retire each."""

from __future__ import annotations

import json
from pathlib import Path

from common.pins import require_pinned


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
    require_pinned("sglang-jax", "rollout/sglang_jax_engine/patches.py")  # written against 0.0.2 only
    applied: list[str] = []
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
    import importlib

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
        importlib.import_module("sgl_jax.srt.layers.attention.native_backend")
    finally:
        tree_util.register_pytree_node_class = original
