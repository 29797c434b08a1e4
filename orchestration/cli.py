"""The `aha` console script: `aha train|serve|eval|prepare-model ...`, the same as `python -m orchestration.<cmd>`."""

from __future__ import annotations

import sys

COMMANDS = {"train": "orchestration.train", "serve": "orchestration.serve", "eval": "orchestration.eval",
            "prepare-model": "orchestration.prepare_model"}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: aha {{{','.join(COMMANDS)}}} ...   (e.g. aha train --config configs/countdown_smollm2_cpu.yaml)",
              file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(COMMANDS[sys.argv[1]])
    sys.argv = [f"aha {sys.argv[1]}", *sys.argv[2:]]
    return module.main() or 0


if __name__ == "__main__":
    sys.exit(main())
