"""TokenBatch: sequences with a loss input at every position, the Tinker API's `Datum`s, and their packing.

A GRPO `TrainBatch` (learner/batch.py) is prompts, completions and one reward per sample; the learner works out the
advantages. A TokenBatch is what a training service's client sends instead: per datum the model's input tokens, the
target token each position predicts (`target_tokens`), and per-position inputs of the chosen loss (`weights` for
cross-entropy; the sampler's `logprobs` and per-token `advantages` for the policy-gradient losses; see
learner/token_losses.py). Position i of the input predicts `targets[i]`, so a datum of N input tokens has N targets
and N of each loss input. Packing right-pads to bucketed lengths, as for GRPO, so jit sees few shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from learner.batch import bucket_length


@dataclass(frozen=True)
class TokenBatch:
    """Datums: input tokens, target tokens and named per-position float inputs, one of each per input position."""

    tokens: list[list[int]]
    targets: list[list[int]]
    inputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    """Per datum, the loss's float inputs by name (`weights`, `logprobs`, `advantages`, ...), each [N]."""

    def __post_init__(self) -> None:
        if len(self.targets) != len(self.tokens) or (self.inputs and len(self.inputs) != len(self.tokens)):
            raise ValueError(f"TokenBatch: {len(self.tokens)} inputs, {len(self.targets)} target lists and "
                             f"{len(self.inputs)} loss-input dicts; give one of each per datum")
        for i, (x, y) in enumerate(zip(self.tokens, self.targets)):
            if not x or len(x) != len(y):
                raise ValueError(f"datum {i}: {len(x)} input tokens but {len(y)} target_tokens; each input position "
                                 "predicts one target (the input is the sequence without its last token)")
            for name, values in (self.inputs[i] if self.inputs else {}).items():
                if np.shape(values) != (len(x),):
                    raise ValueError(f"datum {i}: loss input {name!r} has shape {np.shape(values)}, the input has "
                                     f"{len(x)} tokens; give one value per input position")

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PackedTokens:
    """Padded [rows, L] numpy arrays of a TokenBatch (the last rows all padding up to `rows`)."""

    tokens: np.ndarray  # int32
    targets: np.ndarray  # int32
    valid: np.ndarray  # bool: a real input position
    loss_mask: np.ndarray  # float32: 1 at real positions (every one gets a logprob)
    window: np.ndarray  # int32 [rows, W]: the positions whose logprobs are taken (all of them)
    fields: dict[str, np.ndarray]  # float32 [rows, L] per loss input (0 at padding)
    lengths: list[int]  # each datum's N


def pack_tokens(batch: TokenBatch, names: tuple[str, ...], bucket: int, rows: int) -> PackedTokens:
    """Right-pad every datum to one bucketed length; the loss inputs `names` as [rows, L] (absent ones: 0)."""
    n = len(batch)
    if rows < n:
        raise ValueError(f"pack_tokens: rows={rows} < batch size {n}")
    length = bucket_length(max(len(x) for x in batch.tokens), bucket)
    tokens = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length), np.int32)
    valid = np.zeros((rows, length), bool)
    fields = {name: np.zeros((rows, length), np.float32) for name in names}
    for i, (x, y) in enumerate(zip(batch.tokens, batch.targets)):
        tokens[i, : len(x)] = x
        targets[i, : len(y)] = y
        valid[i, : len(x)] = True
        for name in names:
            if batch.inputs and name in batch.inputs[i]:
                fields[name][i, : len(x)] = np.asarray(batch.inputs[i][name], np.float32)
    window = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    return PackedTokens(tokens, targets, valid, valid.astype(np.float32), window, fields,
                        [len(x) for x in batch.tokens])
