"""TrainBatch: what the loop hands the learner for one GRPO update, and its packing into padded, bucketed arrays.

The loop has already turned rewards into advantages and split the step into mini-batches
(orchestration/update.py): a TrainBatch is one forward_backward's samples, each with its advantage.

Sequences are prompt + completion, right-padded to a multiple of `bucket` tokens so the jitted step sees few
distinct shapes. Arrays are laid out for next-token prediction: position t predicts token t+1, so
`targets[:, t] = tokens[:, t + 1]` and the completion mask, engine logprobs and advantages sit at the position
that *predicts* each completion token. Loss is only ever taken on completion tokens.

A multi-turn episode's completion interleaves the model's sampled turns with tokens the environment appended (tool
results, user messages, the chat template between turns). `TrainBatch.completion_mask` marks which is which, and
`pack` zeroes `loss_mask` at environment tokens: the model did not sample them, so they are context for the later
turns but carry no loss, no importance ratio and no metric (every one of those is weighted by `loss_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from learner.sampling import SamplingTransform


@dataclass(frozen=True)
class TrainBatch:
    """B samples of a GRPO update: ragged token lists, the engine's per-token logprobs and sampling transform, and
    each sample's advantage."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    engine_logprobs: list[list[float]]
    advantages: np.ndarray  # [B]
    group_ids: np.ndarray  # [B]; samples of one prompt share an id (the learner keeps them in one micro-batch)
    sampling: SamplingTransform = SamplingTransform()  # what the engine sampled from (see learner/sampling.py)
    completion_mask: list[list[int]] | None = None
    """Per completion token: 1 = sampled by the model (trained on), 0 = appended by an environment (context only; its
    engine logprob is a placeholder). None: every completion token is the model's (single-turn)."""

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        sizes = {
            "completion_ids": len(self.completion_ids),
            "engine_logprobs": len(self.engine_logprobs),
            "advantages": len(self.advantages),
            "group_ids": len(self.group_ids),
        }
        bad = {k: v for k, v in sizes.items() if v != n}
        if bad:
            raise ValueError(f"TrainBatch has {n} prompts but {bad}: every field needs one entry per sample")
        for i, (c, lp) in enumerate(zip(self.completion_ids, self.engine_logprobs)):
            if len(c) != len(lp):
                raise ValueError(
                    f"TrainBatch sample {i}: {len(c)} completion tokens but {len(lp)} engine logprobs; "
                    "request one logprob per sampled token"
                )
            if not self.prompt_ids[i]:
                raise ValueError(f"TrainBatch sample {i} has an empty prompt: the first completion token needs context")
        if self.completion_mask is not None:
            if len(self.completion_mask) != n:
                raise ValueError(f"TrainBatch has {n} samples but {len(self.completion_mask)} completion masks")
            for i, (c, m) in enumerate(zip(self.completion_ids, self.completion_mask)):
                if len(m) != len(c):
                    raise ValueError(f"TrainBatch sample {i}: {len(c)} completion tokens but a mask of {len(m)}; "
                                     "give one 0/1 per completion token")
        if self.sampling.temperature <= 0:
            raise ValueError(f"TrainBatch.sampling.temperature={self.sampling.temperature}: greedy samples have no "
                             "usable logprobs; sample with T > 0")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def take(self, order: np.ndarray | list[int]) -> TrainBatch:
        """The samples at `order`, in that order."""
        pick = lambda xs: [xs[i] for i in order]  # noqa: E731
        return TrainBatch(pick(self.prompt_ids), pick(self.completion_ids), pick(self.engine_logprobs),
                          np.asarray(self.advantages)[order], np.asarray(self.group_ids)[order], self.sampling,
                          None if self.completion_mask is None else pick(self.completion_mask))


@dataclass(frozen=True)
class OldLogprobs:
    """The policy's logprobs of each sample's completion tokens before a step's first update (`forward(batch,
    "grpo")`): under the sampling transform, and in the engine's convention (the same unless the engine reports
    raw logprobs). A step of several updates (epochs, mini-batches) takes its PPO ratio against these."""

    logprobs: list[np.ndarray]
    compared: list[np.ndarray]

    def take(self, order: np.ndarray | list[int]) -> OldLogprobs:
        return OldLogprobs([self.logprobs[i] for i in order], [self.compared[i] for i in order])


@dataclass(frozen=True)
class PackedBatch:
    """Padded [B, L] arrays (numpy) ready to slice into micro-batches and put on the mesh."""

    tokens: np.ndarray  # int32 [B, L] input tokens
    targets: np.ndarray  # int32 [B, L] tokens[t + 1] (0 past the end)
    valid: np.ndarray  # bool [B, L] real (non-pad) input positions
    loss_mask: np.ndarray  # float32 [B, L] 1 where targets[t] is a completion token the model sampled
    engine_logprobs: np.ndarray  # float32 [B, L] engine logprob of targets[t] (0 where masked)
    advantages: np.ndarray  # float32 [B] per-sequence advantage
    window: np.ndarray  # int32 [B, W]: position predicting completion token j (clipped to L - 1); W = longest
    # completion, bucketed. The learner takes logits at these positions only.
    old_logprobs: np.ndarray | None = None  # float32 [B, L]: OldLogprobs.logprobs where loss_mask is (None: on-policy)
    old_compared: np.ndarray | None = None  # float32 [B, L]: OldLogprobs.compared, the same way


def bucket_length(n: int, bucket: int) -> int:
    """Round a length up to a multiple of `bucket` (at least one bucket)."""
    return max(bucket, -(-n // bucket) * bucket)


@dataclass
class ShapeFloor:
    """The largest padded shapes a GRPO step has run; later steps pad up to them rather than run smaller ones.

    Each new (length, window, prompt block) is a new program to compile (38-48 s a step for SmolLM2 on CPU in the
    demo, docs/demo.md), and sampled lengths vary from step to step: padding a step to the largest shapes seen
    costs a few masked positions, and a run compiles only when a batch outgrows them (learner.pad_to_largest)."""

    length: int = 0
    window: int = 0
    prompts: int = 0  # the shared-prompt block's rows and length (learner/shared_prompts.py)
    prompt_len: int = 0
    prefix: int = 0  # a token loss's detached-prefix window (learner/token_batch.py; GRPO has none)

    def raise_to(self, packed: "PackedBatch", prompts: int = 0, prompt_len: int = 0, prefix: int = 0) -> None:
        self.length = max(self.length, packed.tokens.shape[1])
        self.window = max(self.window, packed.window.shape[1])
        self.prompts, self.prompt_len = max(self.prompts, prompts), max(self.prompt_len, prompt_len)
        self.prefix = max(self.prefix, prefix)


def pack(batch: TrainBatch, bucket: int, rows: int | None = None, floor: ShapeFloor | None = None,
         old: OldLogprobs | None = None) -> PackedBatch:
    """Right-pad prompt+completion to a bucketed length (at least `floor.length`, the window at least
    `floor.window`); add all-masked rows up to `rows` (fixed batch shapes). `old`: the samples' pre-update
    logprobs, laid out as the engine's are."""
    floor = floor or ShapeFloor()
    n = len(batch)
    rows = n if rows is None else rows
    if rows < n:
        raise ValueError(f"pack: rows={rows} < batch size {n}")
    # One token fewer than the sequence: the last token predicts nothing we train on.
    length = bucket_length(max(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)), bucket)
    length = max(length, floor.length)
    tokens = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length), np.int32)
    valid = np.zeros((rows, length), bool)
    loss_mask = np.zeros((rows, length), np.float32)
    engine_lp = np.zeros((rows, length), np.float32)
    adv = np.zeros((rows,), np.float32)
    olds = None if old is None else (np.zeros((rows, length), np.float32), np.zeros((rows, length), np.float32))
    width = min(max(bucket_length(max(len(c) for c in batch.completion_ids), bucket), floor.window), length)
    window = np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy()
    masks = batch.completion_mask or [None] * n
    for i, (p, c, lp, m) in enumerate(zip(batch.prompt_ids, batch.completion_ids, batch.engine_logprobs, masks)):
        seq = np.asarray(list(p) + list(c), np.int32)
        tokens[i, : len(seq)] = seq
        targets[i, : len(seq) - 1] = seq[1:]
        valid[i, : len(seq)] = True
        # Completion token j sits at sequence index len(p) + j and is predicted from index len(p) + j - 1.
        lo, hi = len(p) - 1, len(p) - 1 + len(c)
        model = np.ones(len(c), np.float32) if m is None else np.asarray(m, np.float32)
        loss_mask[i, lo:hi] = model
        engine_lp[i, lo:hi] = np.asarray(lp, np.float32) * model  # environment tokens: 0, as outside the completion
        adv[i] = batch.advantages[i]
        window[i] = np.minimum(lo + np.arange(width), length - 1)
        if olds is not None:
            olds[0][i, lo:hi], olds[1][i, lo:hi] = old.logprobs[i], old.compared[i]
    return PackedBatch(tokens, targets, valid, loss_mask, engine_lp, adv, window, *(olds or (None, None)))


def completion_values(packed: PackedBatch, values: np.ndarray, batch: TrainBatch) -> list[np.ndarray]:
    """Per sample, `values` [rows, L] at the positions that predict its completion tokens (pack's layout)."""
    return [values[i, len(p) - 1: len(p) - 1 + len(c)].astype(np.float32)
            for i, (p, c) in enumerate(zip(batch.prompt_ids, batch.completion_ids))]


def slice_rows(packed: PackedBatch, rows: np.ndarray | slice) -> PackedBatch:
    """The same arrays restricted to some rows (a mini- or micro-batch)."""
    return PackedBatch(*(None if (v := getattr(packed, f)) is None else v[rows]
                         for f in PackedBatch.__dataclass_fields__))
