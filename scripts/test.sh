#!/usr/bin/env bash
# The README's test command: set up (or reuse) the envs and models, then run the whole suite against real
# components (a real vLLM server, a real JAX learner, a real Ray cluster). Extra args go to pytest.
# The TPU env checks (tests/integration/test_tpu_envs.py) install the learner's jax[tpu] env and resolve the vllm-tpu
# engine env: built once per lock into $AHA_CACHE, seconds afterwards.
#
# The whole suite runs as two pytest processes side by side (the lanes of tests/conftest.py): the "live" lane (engines,
# Ray, training runs) in the foreground, the "compile" lane (unit tests, preflight's TPU compiles: no engine, no Ray)
# beside it at a lower priority, its report printed after the live lane's. Naming test paths runs one pytest process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_envs.sh
PYTEST=(.venv/bin/python -m pytest)

for arg in "$@"; do
  if [[ "$arg" == tests* || -e "$arg" ]]; then
    exec "${PYTEST[@]}" "$@"
  fi
done

compile_log=$(mktemp -t aha-compile-lane.XXXXXX)
live_log=$(mktemp -t aha-live-lane.XXXXXX)
AHA_TEST_LANE=compile nice -n 10 "${PYTEST[@]}" tests "$@" >"$compile_log" 2>&1 &
compile_pid=$!
trap 'kill "$compile_pid" 2>/dev/null || true; rm -f "$compile_log" "$live_log"' EXIT

set +e
AHA_TEST_LANE=live "${PYTEST[@]}" tests "$@" 2>&1 | tee "$live_log"
live=${PIPESTATUS[0]}
wait "$compile_pid"
compile=$?
set -e

echo
echo "==================== the compile lane (run beside the live lane above) ===================="
cat "$compile_log"
echo
# pytest's 5 is "no tests collected": a -k or -m that selects nothing in one lane is not a failure of it.
[ "$live" -eq 5 ] && [ "$compile" -ne 5 ] && live=0
[ "$compile" -eq 5 ] && [ "$live" -ne 5 ] && compile=0
summary='(passed|failed|error|deselected|no tests ran).* in [0-9.]+s'
echo "live lane:    $(grep -E "$summary" "$live_log" | tail -1) (exit $live)"
echo "compile lane: $(grep -E "$summary" "$compile_log" | tail -1) (exit $compile)"
[ "$live" -eq 0 ] && [ "$compile" -eq 0 ] && exit 0
[ "$live" -ne 0 ] && exit "$live"
exit "$compile"
