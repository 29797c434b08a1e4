"""tinker-cookbook's own supervised fine-tuning (`tinker_cookbook.supervised.train.main`, unmodified) on a local
conversation JSONL with a held-out test split, against `aha tinker`.

    TINKER_BASE_URL=... TINKER_API_KEY=... HF_HUB_CACHE=~/.cache/aha/hf/hub HF_HUB_OFFLINE=1 \
        PYTHON_OF_THE_COOKBOOK_ENV examples/tinker/cookbook_sft.py model_name=HuggingFaceTB/SmolLM2-135M-Instruct \
        data_path=examples/tinker/sft_conversations.jsonl log_path=runs/cookbook-sft

(PYTHON_OF_THE_COOKBOOK_ENV: what `bash scripts/tinker_cookbook.sh` builds; tests/integration/test_tinker_service.py
runs this against its server.) What is ours is only the choice of the cookbook's own conversation-file dataset
(`FromConversationFileBuilder`, {"messages": [...]} per line, `test_size` rows held out, scored by the cookbook's `SamplerNLLEvaluator` every `eval_every` steps); the batching,
the renderer, the loss (cross_entropy), the learning-rate schedule, the evaluator and the checkpoints are the
cookbook's. The model is named by the server's name for it, whose tokenizer the cookbook loads from setup's offline
Hugging Face cache (docs/tinker.md, "One model name").
"""

from __future__ import annotations

import asyncio

import chz
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


@chz.chz
class CLI:
    model_name: str
    data_path: str
    log_path: str
    renderer_name: str = "qwen3_instruct"  # SmolLM2's ChatML turns
    test_size: int = 4
    batch_size: int = 4
    max_length: int = 256
    learning_rate: float = 5e-4
    lora_rank: int = 8
    eval_every: int = 2
    max_steps: int = 4


def main(cli: CLI) -> None:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=cli.model_name, renderer_name=cli.renderer_name,
                                            max_length=cli.max_length, batch_size=cli.batch_size)
    config = train.Config(
        log_path=cli.log_path, model_name=cli.model_name, recipe_name="aha_sft_local", renderer_name=cli.renderer_name,
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=cli.data_path,
                                                    test_size=cli.test_size),
        learning_rate=cli.learning_rate, lora_rank=cli.lora_rank, eval_every=cli.eval_every, save_every=0,
        max_steps=cli.max_steps)
    asyncio.run(train.main(config))


if __name__ == "__main__":
    main(chz.entrypoint(CLI))
