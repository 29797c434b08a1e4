"""tinker-cookbook's own off-policy distillation (`tinker_cookbook.distillation.train_off_policy.main`, unmodified)
on a local conversation JSONL, against `aha tinker`: the student trains with cross_entropy on the teacher's top-K
tokens at every position ([N, K] soft targets, read from the teacher sampler's `topk_prompt_logprobs`).

    TINKER_BASE_URL=... TINKER_API_KEY=... HF_HUB_CACHE=~/.cache/aha/hf/hub HF_HUB_OFFLINE=1 \
        PYTHON_OF_THE_COOKBOOK_ENV examples/tinker/cookbook_distill.py model_name=HuggingFaceTB/SmolLM2-135M-Instruct \
        data_path=examples/tinker/sft_conversations.jsonl teacher_path=tinker://.../sampler_weights/teacher \
        log_path=runs/cookbook-distill

The teacher is the served model with a LoRA of its own (`teacher_path`, a `save_weights_for_sampler` path; the
server serves one base model, so teacher and student share it). What is ours is only the choice of the cookbook's
conversation-file dataset; the batching, the renderer, the teacher queries, the soft targets and the loss are the
cookbook's.
"""

from __future__ import annotations

import asyncio

import chz
from tinker_cookbook.distillation import train_off_policy
from tinker_cookbook.distillation.datasets import TeacherConfig
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


@chz.chz
class CLI:
    model_name: str
    data_path: str
    teacher_path: str
    log_path: str
    renderer_name: str = "qwen3_instruct"  # SmolLM2's ChatML turns
    batch_size: int = 4
    max_length: int = 256
    learning_rate: float = 5e-4
    lora_rank: int = 8
    n_teacher_targets: int = 5
    max_steps: int = 4


def main(cli: CLI) -> None:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=cli.model_name, renderer_name=cli.renderer_name,
                                            max_length=cli.max_length, batch_size=cli.batch_size)
    domain = train_off_policy.DatasetWithTeacher(
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=cli.data_path),
        teacher_config=TeacherConfig(base_model=cli.model_name, load_checkpoint_path=cli.teacher_path))
    config = train_off_policy.Config(
        learning_rate=cli.learning_rate, dataset_configs=[domain], model_name=cli.model_name,
        recipe_name="aha_distill_local", renderer_name=cli.renderer_name, lora_rank=cli.lora_rank,
        n_teacher_targets=cli.n_teacher_targets, batch_size=cli.batch_size, save_every=0, eval_every=0,
        max_steps=cli.max_steps, log_path=cli.log_path)
    asyncio.run(train_off_policy.main(config))


if __name__ == "__main__":
    main(chz.entrypoint(CLI))
