"""The `aha` console script: `aha COMMAND ...` is `python -m orchestration.<command> ...` (both keep working).

`prepare-model` converts checkpoints with torch and transformers, which only the engine env has: `aha` runs it
there (the interpreter rollout.backend.python would default to), with this clone on its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COMMANDS = {
    "train": ("orchestration.cli.train", "GRPO training with LoRA (--help-config: every config key)"),
    "serve": ("orchestration.cli.serve", "serve a run's trained adapter, OpenAI-compatible"),
    "eval": ("orchestration.cli.eval", "held-out accuracy of the base model and a run's adapter"),
    "preflight": ("orchestration.cli.preflight", "will the learner fit its chips? compile only, no TPU needed"),
    "tinker": ("orchestration.cli.tinker", "a Tinker-API training service on the learner and engines (your own loop)"),
    "prepare-model": ("orchestration.cli.prepare_model", "make a model folder from a local GGUF or HF folder"),
    "tpu-check": ("orchestration.cli.tpu_check", "ten minutes on a new TPU VM: which libtpu settings work here"),
}
IN_ENGINE_ENV = {"prepare-model"}


def usage() -> str:
    lines = [f"  {name:<14} {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(["usage: aha COMMAND [options]   (aha COMMAND --help for its options)", "", *lines,
                      "", "e.g. aha train --config configs/countdown_smollm2_cpu.yaml"])


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(usage(), file=sys.stdout if len(sys.argv) >= 2 else sys.stderr)
        return 0 if len(sys.argv) >= 2 else 2
    if sys.argv[1] not in COMMANDS:
        print(f"aha: unknown command {sys.argv[1]!r}\n{usage()}", file=sys.stderr)
        return 2
    if sys.argv[1] in IN_ENGINE_ENV:
        from rollout.engine_config import engine_interpreter

        root = str(Path(__file__).resolve().parents[2])
        python = engine_interpreter("AHA_VLLM_PYTHON", "vllm")
        return subprocess.call([str(python), "-m", COMMANDS[sys.argv[1]][0], *sys.argv[2:]],
                               env={**os.environ, "PYTHONPATH": root})
    import importlib

    module = importlib.import_module(COMMANDS[sys.argv[1]][0])
    sys.argv = [f"aha {sys.argv[1]}", *sys.argv[2:]]
    return module.main() or 0

