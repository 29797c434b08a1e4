"""tinker-cookbook's own RL training code (`tinker_cookbook.rl.train.main`, unmodified) on a local Countdown JSONL,
against `aha tinker`. Run it with `bash scripts/tinker_cookbook.sh RUN_DIR` (docs/tinker.md), which builds the
cookbook's env and points it at the server; by hand:

    TINKER_BASE_URL=... TINKER_API_KEY=... HF_HUB_CACHE=~/.cache/aha/hf/hub HF_HUB_OFFLINE=1 \
        PYTHON_OF_THE_COOKBOOK_ENV examples/tinker/cookbook_countdown.py \
        model_name=HuggingFaceTB/SmolLM2-135M-Instruct data_path=examples/tinker/countdown_train.jsonl \
        log_path=runs/cookbook max_steps=5

What is ours here is only the task: a dataset builder over the JSONL ({"numbers": [a, b], "target": t} per line)
and a cookbook `ProblemEnv` whose answer check is aha's Countdown rule (common/countdown.py). The loop, the
sampling, the advantages, the loss (importance_sampling) and the checkpoints are the cookbook's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from functools import partial

import chz
from tinker_cookbook import renderers
from tinker_cookbook.rl import train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

from common.countdown import score


class CountdownEnv(ProblemEnv):
    def __init__(self, numbers: list[int], target: int, renderer: renderers.Renderer):
        super().__init__(renderer, convo_prefix=None, format_coef=0.1)
        self.numbers, self.target = numbers, target

    def get_question(self) -> str:
        return (f"Using the numbers {self.numbers}, create an equation that equals {self.target}. You can use "
                "+ - * / and each number exactly once. Reply with one line: the equation, nothing else.")

    def _score(self, text: str) -> float:
        line = text.strip().splitlines()[0] if text.strip() else ""
        return score(line, self.numbers, self.target, format_score=0.5, answer_tag=None, unreadable_score=0.0,
                     equals_target=True)

    def check_format(self, sample_str: str) -> bool:
        return self._score(sample_str) > 0.0  # an equation of the numbers, right or wrong

    def check_answer(self, sample_str: str) -> bool:
        return self._score(sample_str) == 1.0

    def get_reference_answer(self) -> str:
        return str(self.target)


class CountdownDataset(RLDataset):
    def __init__(self, rows: list[dict], batch_size: int, group_size: int, renderer: renderers.Renderer):
        self.rows, self.batch_size, self.group_size, self.renderer = rows, batch_size, group_size, renderer

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rows = self.rows[index * self.batch_size:(index + 1) * self.batch_size]
        return [ProblemGroupBuilder(env_thunk=partial(CountdownEnv, r["numbers"], r["target"], self.renderer),
                                    num_envs=self.group_size, dataset_name="countdown") for r in rows]

    def __len__(self) -> int:
        return len(self.rows) // self.batch_size


@chz.chz
class CountdownDatasetBuilder(RLDatasetBuilder):
    data_path: str
    tokenizer_path: str
    renderer_name: str
    batch_size: int
    group_size: int

    async def __call__(self):
        with open(self.data_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.tokenizer_path))
        return CountdownDataset(rows, self.batch_size, self.group_size, renderer), None


@chz.chz
class CLI:
    model_name: str
    data_path: str
    log_path: str
    renderer_name: str = "qwen3_instruct"  # SmolLM2's ChatML turns; stops at <|im_end|>
    groups_per_batch: int = 4
    group_size: int = 8
    max_tokens: int = 24
    learning_rate: float = 1e-4
    lora_rank: int = 16
    max_steps: int = 5


def main(cli: CLI) -> None:
    config = train.Config(
        learning_rate=cli.learning_rate, model_name=cli.model_name, recipe_name="aha_countdown_local",
        renderer_name=cli.renderer_name, max_tokens=cli.max_tokens, log_path=cli.log_path, lora_rank=cli.lora_rank,
        loss_fn="importance_sampling", eval_every=0, save_every=0, max_steps=cli.max_steps,
        dataset_builder=CountdownDatasetBuilder(data_path=cli.data_path, tokenizer_path=cli.model_name,
                                                renderer_name=cli.renderer_name, batch_size=cli.groups_per_batch,
                                                group_size=cli.group_size))
    asyncio.run(train.main(config))


if __name__ == "__main__":
    main(chz.entrypoint(CLI))
