"""A PEFT LoRA adapter merged into the running engine's weights (W = W0 + alpha/r * B @ A, always from W0; the
math is common/peft_adapter.py's `merged_deltas`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common.peft_adapter import merged_deltas, read_adapter
from common.pins import require_pinned


class MergedLora:
    """Swaps base + LoRA weights into the engine's jitted forward (same shapes and shardings: no recompile)."""

    def __init__(self, engine, model_dir: Path):
        require_pinned("sglang-jax", "rollout/sglang_jax_engine/lora_merge.py")  # reaches into its model runner
        self.runner = engine.scheduler_info["scheduler"].tp_worker.worker.model_runner
        self.model_dir = model_dir
        self.model = self.runner.model
        self.mappings = self._weight_mappings()
        self.base: dict[str, Any] = {}  # HF name -> base weight (numpy), read once from the checkpoint
        self.merged: set[str] = set()  # HF names whose live value is not the base weight

    def _weight_mappings(self) -> dict[str, Any]:
        # Every sgl_jax model class builds its HF-name -> parameter mapping in a `_create_*weight_mappings` method.
        names = [n for n in dir(self.model) if n.startswith("_create_") and n.endswith("weight_mappings")]
        if not names:
            raise RuntimeError(f"{type(self.model).__name__} has no _create_*weight_mappings method; this "
                               "sglang-jax version is not supported by the LoRA merge")
        return getattr(self.model, names[0])()

    def _base_weight(self, name: str):
        if name not in self.base:
            from safetensors import safe_open

            for file in sorted(self.model_dir.glob("*.safetensors")):
                with safe_open(str(file), framework="numpy") as f:
                    if name in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                        self.base[name] = f.get_tensor(name).astype("float32")
                        break
            else:
                raise ValueError(f"base weight {name} not found in {self.model_dir}")
        return self.base[name]

    def load(self, adapter_dir: Path) -> float:
        """Make base + this adapter live (replacing any previous adapter); return the seconds it took."""
        t0 = time.perf_counter()
        deltas = merged_deltas(*read_adapter(adapter_dir))
        if unknown := sorted(set(deltas) - set(self.mappings)):
            raise ValueError(f"adapter targets weights the engine does not have: {unknown[:3]}")
        values = {name: self._base_weight(name) + delta for name, delta in deltas.items()}
        values.update({name: self._base_weight(name) for name in self.merged - set(deltas)})
        self._assign(values)
        self.merged = set(deltas)
        return time.perf_counter() - t0

    def restore_base(self) -> None:
        """Make the base weights live again."""
        self._assign({name: self._base_weight(name) for name in self.merged})
        self.merged = set()

    def _assign(self, values: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp
        from flax import nnx
        from sgl_jax.srt.utils.weight_utils import WeightLoader

        # The engine's own loader turns an HF weight into the parameter (transpose, padding, sharding), so the new
        # arrays match the compiled forward exactly.
        config = self.runner.model_config
        loader = WeightLoader(self.model, config, self.runner.mesh, dtype=config.dtype)
        params = nnx.state(self.model)
        for name, value in values.items():
            loader._process_and_assign_weight(params, name, jnp.asarray(value), self.mappings[name])
        nnx.update(self.model, params)
        leaves = jax.tree_util.tree_leaves(nnx.split(self.model)[1])
        self._swap_leaves(leaves)

    def _swap_leaves(self, leaves: list) -> None:
        # sglang-jax 0.0.2 keeps the flattened model state in a closure of `jitted_run_model` (later versions
        # expose `model_runner.model_state_leaves`); replacing it in place keeps the compiled executables.
        runner = self.runner
        if hasattr(runner, "model_state_leaves"):
            old, put = runner.model_state_leaves, lambda new: setattr(runner, "model_state_leaves", new)
        else:
            fn = runner.jitted_run_model
            cell = fn.__closure__[fn.__code__.co_freevars.index("model_state_leaves")]
            old, put = cell.cell_contents, lambda new: setattr(cell, "cell_contents", new)
        if len(old) != len(leaves) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(old, leaves)):
            raise RuntimeError("merged weights do not match the compiled model's parameter shapes; "
                               "the LoRA merge does not support this model/sglang-jax version")
        put(leaves)
