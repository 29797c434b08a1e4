#!/usr/bin/env bash
# The README's test command: set up (or reuse) the envs and models, then run the whole suite against real
# components (a real vLLM server, a real JAX learner, a real Ray cluster). Extra args go to pytest.
# The TPU env checks (tests/integration/test_tpu_envs.py) install the learner's jax[tpu] env and resolve the vllm-tpu
# engine env: built once per lock into $AHA_CACHE, seconds afterwards.
#
# The whole suite runs as three pytest processes side by side, the lanes of tests/conftest.py: "live" in the
# foreground, "live2" and "compile" (unit tests, preflight's TPU compiles: no engine, no Ray) beside it at lower
# priorities, their reports printed after the live lane's, then one line per lane. Naming test paths runs one pytest
# process, as before.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_envs.sh
PYTEST=(.venv/bin/python -m pytest)

for arg in "$@"; do
  if [[ "$arg" == tests* || -e "$arg" ]]; then
    exec "${PYTEST[@]}" "$@"
  fi
done

logs=$(mktemp -d -t aha-lanes.XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
# lane:niceness of the lanes that run in the background
for lane in live2:5 compile:10; do
  AHA_TEST_LANE=${lane%:*} nice -n "${lane#*:}" "${PYTEST[@]}" tests "$@" >"$logs/${lane%:*}" 2>&1 &
  pids+=($!)
done

set +e
AHA_TEST_LANE=live "${PYTEST[@]}" tests "$@" 2>&1 | tee "$logs/live"
declare -A code=([live]=${PIPESTATUS[0]})
wait "${pids[0]}"; code[live2]=$?
wait "${pids[1]}"; code[compile]=$?
set -e

for lane in live2 compile; do
  echo
  echo "==================== the $lane lane (run beside the live lane above) ===================="
  cat "$logs/$lane"
done
echo
# pytest's 5 is "no tests collected": a -k or -m that selects nothing in one lane is not a failure of that lane.
summary='(passed|failed|error|deselected|no tests ran).* in [0-9.]+s'
status=0
for lane in live live2 compile; do
  echo "$lane lane: $(grep -E "$summary" "$logs/$lane" | tail -1) (exit ${code[$lane]})"
  if [ "${code[$lane]}" -ne 0 ] && [ "${code[$lane]}" -ne 5 ] && [ "$status" -eq 0 ]; then
    status=${code[$lane]}
  fi
done
exit "$status"
