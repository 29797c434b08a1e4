#!/usr/bin/env bash
# The README's test command: set up (or reuse) the envs and models, then run the whole suite against real
# components (a real vLLM server, a real JAX learner, a real Ray cluster). Extra args go to pytest.
# The TPU env checks (tests/integration/test_tpu_envs.py) install the learner's jax[tpu] env and resolve the vllm-tpu
# engine env: built once per lock into $AHA_CACHE, seconds afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_envs.sh
exec .venv/bin/python -m pytest tests "$@"
