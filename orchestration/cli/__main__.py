"""`python -m orchestration.cli COMMAND ...`: the `aha` console script."""

import sys

from orchestration.cli import main

sys.exit(main())
