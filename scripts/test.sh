#!/usr/bin/env bash
# The README's test command: set up (or reuse) the envs and models, then run the whole suite against real
# components (a real vLLM server, a real JAX learner, a real Ray cluster). Extra args go to pytest.
# The TPU env checks (tests/integration/test_tpu_envs.py) install the learner's jax[tpu] env and resolve the vllm-tpu
# engine env: built once per lock into $AHA_CACHE, seconds afterwards.
#
# The whole suite runs as three pytest processes side by side, the lanes of tests/conftest.py (scripts/lanes.sh:
# each lane's failures printed the moment it ends, every failure listed at the end; under CI, nothing may skip).
# Naming test paths runs one pytest process, as before.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_envs.sh

for arg in "$@"; do
  if [[ "$arg" == tests* || -e "$arg" ]]; then
    exec .venv/bin/python -m pytest "$@"
  fi
done
exec bash scripts/lanes.sh "$@"
