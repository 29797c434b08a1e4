"""tinker-cookbook's own DPO (`tinker_cookbook.preference.train_dpo.main`, unmodified) on local comparison JSONL files
with a held-out test file, against `aha tinker`.

    TINKER_BASE_URL=... TINKER_API_KEY=... HF_HUB_CACHE=~/.cache/aha/hf/hub HF_HUB_OFFLINE=1 \
        PYTHON_OF_THE_COOKBOOK_ENV examples/tinker/cookbook_dpo.py model_name=HuggingFaceTB/SmolLM2-135M-Instruct \
        train_path=examples/tinker/dpo_comparisons.jsonl test_path=examples/tinker/dpo_comparisons_test.jsonl \
        log_path=runs/cookbook-dpo

(PYTHON_OF_THE_COOKBOOK_ENV: what `bash scripts/tinker_cookbook.sh` builds; tests/integration/test_tinker_service.py
runs this against its server.) The cookbook's DPO CLI (`recipes/preference/dpo/train.py`) knows only Hub datasets, so
what is ours is only the choice of the cookbook's own local-file comparison builder (`ComparisonBuilderFromJsonl`:
one {"comparison": {prompt_conversation, completion_A, completion_B}, "label"} per line, as its
`combine_preference_datasets.py` writes them) under its `DPODatasetBuilderFromComparisons`; the reference sampler
(the initial weights), the DPO loss (`forward_backward_custom`), the test split's `SamplerNLLEvaluator` every
`eval_every` steps, the schedule and the checkpoints are the cookbook's.
"""

from __future__ import annotations

import chz
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


@chz.chz
class CLI:
    model_name: str
    train_path: str
    test_path: str
    log_path: str
    renderer_name: str = "qwen3_instruct"  # SmolLM2's ChatML turns
    batch_size: int = 4  # comparisons per step (two datums each)
    max_length: int = 256
    learning_rate: float = 1e-4
    dpo_beta: float = 0.1
    lora_rank: int = 8
    eval_every: int = 2


def main(cli: CLI) -> None:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=cli.model_name, renderer_name=cli.renderer_name,
                                            max_length=cli.max_length, batch_size=cli.batch_size)
    comparisons = ComparisonBuilderFromJsonl(train_path=cli.train_path, test_path=cli.test_path)
    config = train_dpo.Config(
        log_path=cli.log_path, model_name=cli.model_name, recipe_name="aha_dpo_local", renderer_name=cli.renderer_name,
        dataset_builder=DPODatasetBuilderFromComparisons(common_config=common, comparison_builder=comparisons),
        learning_rate=cli.learning_rate, dpo_beta=cli.dpo_beta, lora_rank=cli.lora_rank, eval_every=cli.eval_every,
        save_every=0)
    train_dpo.main(config)


if __name__ == "__main__":
    main(chz.entrypoint(CLI))
