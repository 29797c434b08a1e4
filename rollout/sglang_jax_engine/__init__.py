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
documented with its upstream cause; any other sglang-jax version is refused with one line (common/pins.py,
docs/patches.md). Module level imports no engine code (engine imports happen inside functions), so tests import the
pure helpers from the learner env.

One module per job: `wire` (request translation, pure), `patches` (start-up fixes of the pinned sglang-jax),
`lora_merge` (a PEFT adapter merged into the live weights), `app` (the engine and the HTTP app). The program that
runs it is `rollout/sglang_jax_entry.py`.
"""
