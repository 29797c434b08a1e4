#!/usr/bin/env bash
# Run tinker-cookbook's own RL training code against a running `aha tinker` (docs/tinker.md):
#   bash scripts/tinker_cookbook.sh RUN_DIR [key=value ...]    # RUN_DIR: the server's --run-dir (its tinker.json)
# Builds (once per machine, from requirements/tinker-cookbook.lock) the cookbook's env, then runs
# examples/tinker/cookbook_countdown.py: tinker_cookbook.rl.train.main on examples/tinker/countdown_train.jsonl,
# 5 steps on the server's model, logging to RUN_DIR/cookbook (metrics.jsonl there). Extra args go to its CLI.
set -euo pipefail
source "$(dirname "$0")/env_lib.sh"
run_dir=${1:?usage: bash scripts/tinker_cookbook.sh RUN_DIR [key=value ...]}
shift
info="$run_dir/tinker.json"
[ -f "$info" ] || { echo "tinker_cookbook: no $info; start the server first: aha tinker --config configs/tinker_smollm2_cpu.yaml --run-dir $run_dir" >&2; exit 2; }
env_dir=$(build_env tinker-cookbook)
read -r url key < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["base_url"], d["api_key"])' "$info")
# The server's name for its model (its Hugging Face id); the cookbook loads its tokenizer by that name from the
# offline Hugging Face cache setup laid out (docs/tinker.md, "One model name").
read -r model hub < <("$ROOT/.venv/bin/python" -c '
import sys
from common.hf_cache import hub_dir
from orchestration.config.files import load_config
from orchestration.config.schema import ServiceConfig
print(load_config(sys.argv[1], [], ServiceConfig).model.resolved_hf_id, hub_dir())' "$run_dir/config.yaml")
TINKER_BASE_URL=$url TINKER_API_KEY=$key TINKER_TELEMETRY=0 PYTHONPATH="$ROOT" HF_HUB_CACHE=$hub HF_HUB_OFFLINE=1 \
  "$env_dir/bin/python" "$ROOT/examples/tinker/cookbook_countdown.py" model_name="$model" \
  data_path="$ROOT/examples/tinker/countdown_train.jsonl" log_path="$run_dir/cookbook" "$@"
