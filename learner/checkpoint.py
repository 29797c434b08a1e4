"""Orbax checkpoints of the learner: LoRA params, optimizer state, step, RNG and the caller's extras.

Only the LoRA weights and the optimizer state are saved: base weights never change and come from the HF
folder. Orbax writes each step to a temporary folder and renames it when complete, so a checkpoint cut off
mid-write is never picked up by `latest_step`; `keep` bounds how many stay on disk.

Each checkpoint's JSON item records the LoRA leaf shapes and config, so resuming with a config that does not
fit (another rank, other target modules) fails with the leaf and the setting to change, not a tree diff.

The directory may be a storage URI (`gs://bucket/run/checkpoints`, common/storage.py): Orbax then writes through
tensorstore's GCS driver and marks each complete step with a commit file instead of a rename.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import orbax.checkpoint as ocp

from common.storage import absolute, use_emulator

log = logging.getLogger(__name__)


def leaf_shapes(tree: dict) -> dict[str, list[int]]:
    """'layers.0.attn.q_proj.w_lora_a' -> shape, for a nested dict of arrays."""
    out: dict[str, list[int]] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = list(np.shape(node))

    walk(tree, "")
    return out


def check_fits(saved: dict[str, list[int]], expected: dict[str, list[int]], saved_lora: dict, lora: dict) -> None:
    """Raise one readable line for the first LoRA leaf where a checkpoint and the current config disagree."""
    for name in sorted(set(saved) | set(expected)):
        if name not in saved or name not in expected:
            where = "config" if name not in saved else "checkpoint"
            raise ValueError(
                f"checkpoint does not fit the config: LoRA weight {name} exists only in the {where} (checkpoint "
                f"target_modules {saved_lora.get('target_modules')} vs config {lora['target_modules']}); set "
                "learner.lora.target_modules to the checkpoint's, or use a fresh checkpoint_dir"
            )
        if saved[name] != expected[name]:
            hint = ""
            if saved_lora.get("rank") != lora["rank"]:
                hint = (f" (rank {saved_lora.get('rank')} in the checkpoint vs {lora['rank']} in config); set "
                        f"learner.lora.rank={saved_lora.get('rank')} to resume it")
            raise ValueError(
                f"checkpoint does not fit the config at {name}: shape {tuple(saved[name])} in the checkpoint vs "
                f"{tuple(expected[name])} from the config{hint or '; check learner.lora and the base model'}, "
                "or use a fresh checkpoint_dir"
            )


class Checkpointer:
    """A thin Orbax CheckpointManager: save(step, ...) / latest_step() / restore(step, ...)."""

    def __init__(self, directory: str | Path, keep: int):
        use_emulator()
        self.directory = absolute(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self._mgr = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, lora: dict, opt_state: Any, meta: dict) -> None:
        meta = {**meta, "lora_shapes": leaf_shapes(lora)}
        self._mgr.save(
            step,
            args=ocp.args.Composite(
                lora=ocp.args.StandardSave(lora), opt=ocp.args.StandardSave(opt_state), meta=ocp.args.JsonSave(meta)
            ),
        )
        self._mgr.wait_until_finished()
        log.info("saved checkpoint step %d to %s", step, self.directory)

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def meta(self, step: int) -> dict:
        """The JSON item of checkpoint `step` (what `save` was given as meta, plus the LoRA leaf shapes)."""
        return self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, abstract_lora: dict, abstract_opt: Any, lora_cfg: dict) -> tuple[dict, Any, dict]:
        """(lora, opt_state, meta) of `step`, after checking the checkpoint fits the current LoRA config."""
        meta = self.meta(step)
        check_fits(meta["lora_shapes"], leaf_shapes(abstract_lora), meta.get("lora", {}), lora_cfg)
        restored = self._mgr.restore(
            step,
            args=ocp.args.Composite(
                lora=ocp.args.StandardRestore(abstract_lora), opt=ocp.args.StandardRestore(abstract_opt)
            ),
        )
        return restored["lora"], restored["opt"], meta

    def close(self) -> None:
        self._mgr.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
