"""`python -m orchestration.train`: the product's main command, as `ray job submit ... -- python -m
orchestration.train --config configs/X.yaml` names it; the entry point lives with the other CLIs."""

import sys

from orchestration.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
