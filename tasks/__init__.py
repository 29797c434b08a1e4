"""The problem side: task data (prompts for Countdown and math, with references for the rewards), a resumable
prompt stream, and the rendering of prompts into the model's token ids. `rollout/` and `learner/` are the solver side.

Everything is made locally and deterministically from the config (nothing is downloaded at run time):
- Countdown: random numbers combined by a random valid expression tree, so every puzzle is solvable and keeps its
  solution; intermediate values stay positive integers, as in the game.
- Math: a few GSM8K-style word-problem templates with exact integer answers, small enough for CPU runs; or the
  real GSM8K JSONL (`question`, `answer` ending in `#### N`) from a local path.
- Dataset: the user's own rows (JSONL, Parquet or a `datasets` save_to_disk folder), read lazily row by row.
Train and eval never overlap: a puzzle's split is fixed by a hash of its content, not by the order of drawing.
Prompts are kept short because on the CPU demo every prompt token costs rollout time.

Only the standard library and pydantic are imported (numpy, pyarrow, datasets only once a data file is opened): the
driver and any Ray worker can import this cheaply.

One module per job: `config` (DataConfig), `templates` (prompt texts and rendering), `generators` (Countdown
puzzles, word problems), `gsm8k` (the JSONL loader), `prompt` (Prompt), `dataset` (the hash-split draw, setup_dataset), `episodes` (multi-turn episodes played through an engine), `heldout` (the held-out split and its scoring),
`rows` (random access to JSONL, Parquet and save_to_disk rows), `row_prompts` (a data file's rows as prompts, its
held-out split), `errors` (DataError), `stream` (PromptStream), `render` (PromptRenderer: chat template, token ids).
"""

from tasks.config import DataConfig
from tasks.dataset import setup_dataset
from tasks.prompt import Prompt
from tasks.errors import DataError, DatasetTooSmall
from tasks.stream import PromptStream

__all__ = ["DataConfig", "DataError", "DatasetTooSmall", "Prompt", "PromptStream", "setup_dataset"]
