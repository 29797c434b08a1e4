#!/usr/bin/env bash
# Build (or reuse) one environment of scripts/env_lib.sh's ENV_TABLE from its lock and print its folder, e.g.
#   bash scripts/build_env.sh learner-tpu     # CI's proof that the TPU learner env installs (tests/integration/test_tpu_envs.py)
set -euo pipefail
source "$(dirname "$0")/env_lib.sh"
[ -n "$(env_field "${1:-}" 2)" ] || { echo "build_env: unknown env '${1:-}' (known: $(awk 'NF { printf "%s ", $1 }' <<<"$ENV_TABLE"))" >&2; exit 2; }
build_env "$1"
