#!/usr/bin/env bash
# Build (or reuse) the SGLang-JAX engine environment, for `rollout.backend.kind: sglang_jax`.
#
# Why its own env: sglang-jax 0.0.2 needs Python >= 3.12 and pins jax 0.8 / flax 0.12.x, which fight the learner's
# jax 0.12; the engine runs as a server subprocess (rollout/sglang_jax_entry.py) from this env, like vLLM from its
# own. Same layout as scripts/setup_envs.sh: $AHA_CACHE/envs/sglang_jax-<hash of requirements + python version>,
# a `.complete` marker, and the symlink $AHA_CACHE/envs/sglang_jax that the backend uses by default.
# Optional: the vLLM backend and the tests that do not name sglang_jax never need it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${AHA_CACHE:-$HOME/.cache/aha}
REQ="$ROOT/requirements/sglang_jax.txt"
PYVER=3.12
mkdir -p "$CACHE/envs"

find_python() {  # an interpreter of version $PYVER, or fail with what to install
  local c
  # pyenv's shim exists even when that version is not selected, so try each candidate by running it.
  for c in "$(pyenv root 2>/dev/null)/versions/$PYVER"*/bin/python"$PYVER" "python$PYVER"; do
    if "$c" -c "" >/dev/null 2>&1; then command -v "$c"; return 0; fi
  done
  echo "setup_sglang_env: no Python $PYVER found; install it (e.g. pyenv install $PYVER)" >&2; return 1
}

hash=$( (cat "$REQ"; echo "$PYVER") | sha256sum | cut -c1-12)
dir="$CACHE/envs/sglang_jax-$hash"
if [ ! -f "$dir/.complete" ]; then
  echo "setup_sglang_env: building $dir (first time only; a few minutes)"
  rm -rf "$dir"
  "$(find_python)" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  "$dir/bin/python" -m pip install -q -r "$REQ"
  nodeps=$(sed -n 's/^# nodeps: *//p' "$REQ")
  if [ -n "$nodeps" ]; then "$dir/bin/python" -m pip install -q --no-deps $nodeps; fi
  "$dir/bin/python" -c "import sgl_jax, jax; print('setup_sglang_env: sgl_jax', sgl_jax.__file__, 'jax', jax.__version__)"
  touch "$dir/.complete"
fi
ln -sfn "$dir" "$CACHE/envs/sglang_jax"
echo "setup_sglang_env: ok ($CACHE/envs/sglang_jax)"
