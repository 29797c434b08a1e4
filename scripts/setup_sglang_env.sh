#!/usr/bin/env bash
# Build (or reuse) only the SGLang-JAX engine environment, for `rollout.backend.kind: sglang_jax` (setup_envs.sh
# builds it too, as an optional step).
#
# Why its own env: sglang-jax 0.0.2 needs Python >= 3.12 and pins jax 0.8 / flax 0.12.x, which fight the learner's
# jax 0.12; the engine runs as a server subprocess (rollout/sglang_jax_entry.py) from this env, like vLLM from its
# own. Installed from requirements/sglang_jax.lock into $AHA_CACHE/envs/sglang_jax-<hash>, linked as
# $AHA_CACHE/envs/sglang_jax, the backend's default interpreter.
set -euo pipefail
source "$(dirname "$0")/env_lib.sh"
dir=$(build_env sglang_jax)
"$dir/bin/python" -c "import sgl_jax, jax; print('setup_sglang_env: sgl_jax', sgl_jax.__file__, 'jax', jax.__version__)"
echo "setup_sglang_env: ok ($CACHE/envs/sglang_jax)"
