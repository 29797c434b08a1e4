#!/usr/bin/env bash
# Regenerate the lockfiles: requirements/NAME.lock from requirements/NAME.in, with hashes, for NAME's Python and
# platform (scripts/env_lib.sh's ENV_TABLE). Run after editing a .in file, and commit the .lock: setup installs
# exactly the lock, so an env is the same wherever and whenever it is built.
#   bash scripts/lock.sh                 # every env
#   bash scripts/lock.sh vllm learner    # some
#   LOCK_OUT=DIR bash scripts/lock.sh vllm-tpu   # write DIR/vllm-tpu.lock instead (CI's resolve check)
set -euo pipefail
source "$(dirname "$0")/env_lib.sh"
UV=$(uv_bin)
names=("$@")
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(awk 'NF { print $1 }' <<<"$ENV_TABLE")

for name in "${names[@]}"; do
  py=$(env_field "$name" 2); platform=$(env_field "$name" 3)
  [ -n "$py" ] || { echo "lock: unknown env $name (known: $(awk 'NF { printf "%s ", $1 }' <<<"$ENV_TABLE"))" >&2; exit 1; }
  req="$ROOT/requirements/$name.in"; out="${LOCK_OUT:-$ROOT/requirements}/$name.lock"
  args=(--generate-hashes --python-version "$py" --python-platform "$platform" --index-url https://pypi.org/simple
        --emit-index-url --no-annotate --custom-compile-command "bash scripts/lock.sh $name")
  [ -f "$ROOT/requirements/$name.excludes" ] && args+=(--excludes "$ROOT/requirements/$name.excludes")
  # Metadata we state instead of building it (an sdist whose dependencies are dynamic: see that file).
  [ -f "$ROOT/requirements/$name.uv.toml" ] && args+=(--config-file "$ROOT/requirements/$name.uv.toml")
  if grep -q '+cpu' "$req"; then torch_wheels_or_fail; args+=(--find-links "$TORCH_WHEELS" --emit-find-links); fi
  echo "lock: $name (Python $py, $platform) -> $out" >&2
  "$UV" pip compile "$req" -o "$out" "${args[@]}" --quiet
done
