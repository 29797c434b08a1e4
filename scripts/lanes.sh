#!/usr/bin/env bash
# The whole suite as three pytest processes side by side, the lanes of tests/conftest.py (scripts/test.sh runs it
# after setup): "live" in the foreground, "live2" and "compile" (unit tests, preflight's TPU compiles: no engine, no
# Ray) beside it at lower priorities, their logs printed after the live lane's. Extra args go to every lane's pytest.
#
# A red suite says why at once: the moment a lane ends badly it prints its failing tests (FAILED / ERROR lines,
# else its log's last lines), whatever the other lanes are doing; and the last lines of the run list every failure
# of every lane. Under CI (CI=true, as .ci/run sets it) a lane that collects no test fails (pytest's exit 5), and
# so does any skip or xfail (tests/ci_strict.py); elsewhere exit 5 is a -k or -m that selected nothing in a lane.
# Each lane's full log stays in AHA_LANE_LOGS (default: a temporary folder, removed when every lane passed).
# AHA_TESTS names what the lanes run, paths separated by spaces (default tests/; the quick tier names its few;
# tests/unit/test_ci_strict.py runs a throwaway folder).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTEST=(.venv/bin/python -m pytest)
read -ra TESTS <<< "${AHA_TESTS:-tests}"
ci=0
case "${CI:-}" in 1 | [Tt]rue | TRUE | [Yy]es) ci=1 ;; esac
logs=${AHA_LANE_LOGS:-$(mktemp -d -t aha-lanes.XXXXXX)}
mkdir -p "$logs"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

bad() {  # bad CODE: whether a lane's exit code fails the suite
  [ "$1" -ne 0 ] && { [ "$1" -ne 5 ] || [ $ci = 1 ]; }
}

failures() {  # failures LANE: its failing tests, one line each, named by the lane
  if grep -qE '^(FAILED|ERROR) ' "$logs/$1"; then
    grep -E '^(FAILED|ERROR) ' "$logs/$1" | sed "s/^/$1: /"
  elif [ "$(cat "$logs/$1.code")" -eq 5 ] || grep -q "^CI runs every test: .* collected none" "$logs/$1"; then
    echo "$1: collected no test (a failure under CI)"
  else
    echo "$1: no failing test named (exit $(cat "$logs/$1.code")); the last lines of its log ($logs/$1):"
    tail -n 5 "$logs/$1" | sed "s/^/$1:   /"
  fi
}

ended() {  # ended LANE CODE: the moment a lane ends, its failures if it failed
  echo "$2" > "$logs/$1.code"
  if bad "$2"; then
    echo
    echo "==================== the $1 lane failed (exit $2): ===================="
    failures "$1"
  fi
  touch "$logs/$1.done"  # after the lines above: tests/unit/test_ci_strict.py waits for it
}

run_lane() {  # run_lane LANE NICENESS [pytest args]: in the background; killed with the suite
  local lane=$1 nice=$2 child
  shift 2
  (
    trap 'kill "$child" 2>/dev/null' TERM
    AHA_TEST_LANE=$lane nice -n "$nice" "${PYTEST[@]}" "${TESTS[@]}" "$@" >"$logs/$lane" 2>&1 &
    child=$!
    set +e
    wait "$child"
    ended "$lane" $?
  ) &
  pids+=($!)
}

run_lane live2 5 "$@"
run_lane compile 10 "$@"
set +e
AHA_TEST_LANE=live "${PYTEST[@]}" "${TESTS[@]}" "$@" 2>&1 | tee "$logs/live"
ended live "${PIPESTATUS[0]}"
wait "${pids[@]}"
set -e

for lane in live2 compile; do
  echo
  echo "==================== the $lane lane (run beside the live lane above) ===================="
  cat "$logs/$lane"
done
echo
summary='(passed|failed|error|deselected|no tests ran).* in [0-9.]+s'
status=0
for lane in live live2 compile; do
  code=$(cat "$logs/$lane.code")
  echo "$lane lane: $(grep -E "$summary" "$logs/$lane" | tail -1) (exit $code)"
  if bad "$code" && [ "$status" -eq 0 ]; then
    status=$code
    [ "$code" -eq 5 ] && status=1
  fi
done
if [ "$status" -ne 0 ]; then
  echo "every failure (full logs in $logs):"
  for lane in live live2 compile; do
    if bad "$(cat "$logs/$lane.code")"; then failures "$lane"; fi
  done
elif [ -z "${AHA_LANE_LOGS:-}" ]; then
  rm -rf "$logs"
fi
exit "$status"
