#!/usr/bin/env bash
# The README's test command: set up (or reuse) the envs and models, then run the whole suite against real
# components (a real vLLM server, a real JAX learner, a real Ray cluster). Extra args go to pytest.
#   bash scripts/test.sh            # the full suite (what CI runs)
#   bash scripts/test.sh --quick    # the quick tier: unit tests + one tiny end-to-end pass (QUICK below)
# The TPU env checks (tests/integration/test_tpu_envs.py) install the learner's jax[tpu] env and resolve the vllm-tpu
# engine env: built once per lock into $AHA_CACHE, seconds afterwards.
#
# The suite runs as three pytest processes side by side, the lanes of tests/conftest.py (scripts/lanes.sh: each
# lane's failures printed the moment it ends, every failure listed at the end; under CI, nothing may skip). Before it,
# bench/box_speed.py measures the box, and its figures are printed again beside the suite's time: a suite's minutes
# mean little without the speed of the box that ran it (docs/benchmarks.md).
# Naming test paths runs one pytest process, as before.
set -euo pipefail
cd "$(dirname "$0")/.."
# The quick tier: every unit test, and one tiny run of each entry point (train 2 steps, resume 1, serve 1 request,
# one Tinker forward_backward: tests/integration/test_quick_e2e.py). The full suite runs all of it too.
QUICK="tests/unit tests/integration/test_quick_e2e.py"

quick=0
args=()
for arg in "$@"; do
  if [ "$arg" = --quick ]; then quick=1; else args+=("$arg"); fi
done
bash scripts/setup_envs.sh

for arg in "${args[@]}"; do
  if [[ "$arg" == tests* || -e "$arg" ]]; then
    exec .venv/bin/python -m pytest "${args[@]}"
  fi
done
[ $quick = 1 ] && export AHA_TESTS=$QUICK
box=$(.venv/bin/python bench/box_speed.py --repeats 1 | sed 's/ (best of 1: .*)//' | paste -sd ';' | sed 's/;/; /g')
echo "box speed (bench/box_speed.py): $box"
start=$(date +%s)
set +e
bash scripts/lanes.sh "${args[@]}"
status=$?
set -e
elapsed=$(( $(date +%s) - start ))
echo "$([ $quick = 1 ] && echo "quick tier" || echo "suite"): exit $status in $((elapsed / 60)) min $((elapsed % 60)) s on a box of speed: $box"
exit $status
