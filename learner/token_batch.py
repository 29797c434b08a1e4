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

from learner.batch import ShapeFloor, bucket_length


@dataclass(frozen=True)
class TokenBatch:
    """Datums: input tokens, target tokens and named per-position float inputs, one of each per input position."""

    tokens: list[list[int]]
    targets: list[list[int]] | list[list[list[int]]]
    """Per datum, the target each position predicts [N], or K targets per position [N, K] (soft targets: the
    cross-entropy of a distillation, whose `weights` are [N, K] too)."""
    inputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    """Per datum, the loss's float inputs by name (`weights`, `logprobs`, `advantages`, ...), each [N] (or [N, K]
    beside [N, K] targets)."""
    adapters: tuple[str, ...] = ()
    """Per datum, the adapter it trains: several tenants' datums in one pass (learner/tenant_stack.py); empty: all
    the call's adapter."""

    def __post_init__(self) -> None:
        if len(self.targets) != len(self.tokens) or (self.inputs and len(self.inputs) != len(self.tokens)):
            raise ValueError(f"TokenBatch: {len(self.tokens)} inputs, {len(self.targets)} target lists and "
                             f"{len(self.inputs)} loss-input dicts; give one of each per datum")
        if self.adapters and len(self.adapters) != len(self.tokens):
            raise ValueError(f"TokenBatch: {len(self.adapters)} adapter names for {len(self.tokens)} datums")
        for i, (x, y) in enumerate(zip(self.tokens, self.targets)):
            if not x or len(x) != len(y):
                raise ValueError(f"datum {i}: {len(x)} input tokens but {len(y)} target_tokens; each input position "
                                 "predicts one target (the input is the sequence without its last token)")
            shape = np.shape(y)
            if len(shape) > 2 or (len(shape) == 2 and shape[1] < 1):
                raise ValueError(f"datum {i}: target_tokens of shape {shape}; give [N] or [N, K] targets")
            for name, values in (self.inputs[i] if self.inputs else {}).items():
                if np.shape(values) not in ((len(x),), shape):
                    raise ValueError(f"datum {i}: loss input {name!r} has shape {np.shape(values)}, the input has "
                                     f"{len(x)} tokens and its targets the shape {shape}; give one value per input "
                                     "position (or per target)")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def width(self) -> int:
        """K of the widest datum's [N, K] targets; 0 when every datum has one target per position."""
        return max((np.shape(y)[1] for y in self.targets if np.ndim(y) == 2), default=0)


@dataclass(frozen=True)
class PackedTokens:
    """Padded [rows, L] numpy arrays of a TokenBatch (the last rows all padding up to `rows`; L > every datum's N,
    so position L - 1 is padding in every row and a window clipped to it adds nothing).

    Each datum splits at `starts[i]`, its gate input's first non-zero position (learner/token_losses.py GATE): the
    positions before it (its prefix, a prompt) get logprobs without a gradient, those from it on (the window) get
    both. Where every datum's prefix is the start of its own input (targets[j] = tokens[j + 1]) the datums that
    share one can run it once (`shareable`; learner/shared_prompts.py reads `tokens`, `valid`, `window`)."""

    tokens: np.ndarray  # int32
    targets: np.ndarray  # int32
    valid: np.ndarray  # bool: a real input position
    loss_mask: np.ndarray  # float32: 1 at real positions (every one gets a logprob)
    window: np.ndarray  # int32 [rows, W]: positions starts[i], starts[i] + 1, ... (clipped to L - 1)
    active_mask: np.ndarray  # float32: 1 at real positions from starts[i] on
    prefix_window: np.ndarray | None  # int32 [rows, S]: positions 0 .. S - 1 (None: no datum has a prefix)
    prefix_mask: np.ndarray  # float32: 1 at real positions before starts[i]
    fields: dict[str, np.ndarray]  # float32 [rows, L] per loss input (0 at padding)
    lengths: list[int]  # each datum's N
    shareable: bool


def gate_starts(batch: TokenBatch, gate: str | None) -> list[int]:
    """Per datum, the first position whose `gate` input is non-zero (at most N - 1: a window is never empty)."""
    starts = []
    for i, x in enumerate(batch.tokens):
        values = batch.inputs[i].get(gate) if gate and batch.inputs else None
        nonzero = np.flatnonzero(np.asarray(values).reshape(len(x), -1).any(axis=1)) if values is not None \
            else np.zeros(1, np.int64)
        starts.append(int(min(nonzero[0] if len(nonzero) else len(x) - 1, len(x) - 1)))
    return starts


def pack_tokens(batch: TokenBatch, names: tuple[str, ...], gate: str | None, bucket: int, rows: int,
                floor: ShapeFloor | None = None) -> PackedTokens:
    """Right-pad every datum to one bucketed length (at least `floor.length`; the window and the prefix window at
    least `floor`'s: a client's batches then run the shapes already compiled); the loss inputs `names` as [rows, L]
    (absent ones: 0)."""
    floor = floor or ShapeFloor()
    n = len(batch)
    if rows < n:
        raise ValueError(f"pack_tokens: rows={rows} < batch size {n}")
    length = max(bucket_length(max(len(x) for x in batch.tokens) + 1, bucket), floor.length)
    starts = gate_starts(batch, gate) + [0] * (rows - n)
    sizes = [len(x) for x in batch.tokens] + [0] * (rows - n)
    k = batch.width  # [N, K] targets: every datum's as [L, K], a narrower one's extra columns target 0 with weight 0
    per_position = (k,) if k else ()
    tokens = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length, *per_position), np.int32)
    valid = np.zeros((rows, length), bool)
    fields = {name: np.zeros((rows, length, *per_position), np.float32) for name in names}
    shareable = not k  # a shared prefix's targets are its next tokens, one per position
    for i, (x, y) in enumerate(zip(batch.tokens, batch.targets)):
        tokens[i, : len(x)] = x
        valid[i, : len(x)] = True
        if k:
            wide = np.ndim(y) == 2
            y = np.asarray(y).reshape(len(x), -1)
            targets[i, : len(x), : y.shape[1]] = y
        else:
            targets[i, : len(y)] = y
            shareable = shareable and list(y[: starts[i]]) == list(x[1: starts[i] + 1])
        for name in names:
            if batch.inputs and name in batch.inputs[i]:
                value = np.asarray(batch.inputs[i][name], np.float32)
                if not k:
                    fields[name][i, : len(x)] = value
                    continue
                if wide and value.ndim == 1:
                    raise ValueError(f"datum {i}: {name!r} has one value per position beside [N, K] target_tokens; "
                                     f"give it their shape {y.shape}")
                fields[name][i, : len(x), : y.shape[1]] = value.reshape(len(x), -1)
    pos = np.arange(length)[None]
    first = np.asarray(starts)[:, None]
    active = valid & (pos >= first)
    prefix = valid & (pos < first)
    width = min(max(bucket_length(max(size - start for size, start in zip(sizes, starts)), bucket), floor.window),
                length)
    window = np.minimum(first + np.arange(width)[None], length - 1).astype(np.int32)
    longest = max(starts)
    prefix_window = None
    if longest > 0:  # none at all is another program (no prefix pass), not a shape to pad
        span = min(max(bucket_length(longest, bucket), floor.prefix), length)
        prefix_window = np.broadcast_to(np.arange(span, dtype=np.int32), (rows, span)).copy()
    return PackedTokens(tokens, targets, valid, valid.astype(np.float32), window, active.astype(np.float32),
                        prefix_window, prefix.astype(np.float32), fields, [len(x) for x in batch.tokens], shareable)
