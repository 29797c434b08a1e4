"""The Tinker API's protobuf parts, read and written with the SDK's own generated module (`tinker.proto`).

forward_backward requests arrive as a `ForwardBackwardRequest` (datums: input chunks of int32 tokens, loss inputs
as dense or CSR tensors); forward_backward and sample results go back as `ForwardBackwardOutput` and
`SampleResponse`. Everything else on the wire is JSON (orchestration/service/app.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from common.sampling import Completion
from learner.token_batch import TokenBatch
from orchestration.service.futures import UserError
from orchestration.service.sampling import SampleAnswer, Target, Topk

_DTYPES = {pb.DTYPE_FLOAT32: "<f4", pb.DTYPE_INT64: "<i8", pb.DTYPE_INT32: "<i4"}


def read_forward_backward(body: bytes) -> pb.ForwardBackwardRequest:
    request = pb.ForwardBackwardRequest()
    request.ParseFromString(body)
    return request


def read_head(prefix: bytes) -> tuple[str, int]:
    """A ForwardBackwardRequest's model_id (field 1) and seq_id (field 2) from the start of its body: the SDK's
    serializer writes fields in number order, so they come before the data even when the rest is not read."""
    model_id, seq_id, at = None, None, 0

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = prefix[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    try:
        while at < len(prefix) and (model_id is None or seq_id is None):
            tag = varint()
            number, kind = tag >> 3, tag & 7
            if (number, kind) == (1, 2):
                length = varint()
                model_id, at = prefix[at:at + length].decode(), at + length
            elif (number, kind) == (2, 0):
                seq_id = varint()
            else:
                break
    except (IndexError, UnicodeDecodeError):
        pass
    if model_id is None or seq_id is None:
        raise UserError("a forward_backward body that does not start with its model_id and seq_id")
    return model_id, seq_id


def loss_settings(request: pb.ForwardBackwardRequest) -> dict[str, float]:
    """loss_fn_config: the v2 map (numbers and strings), else the legacy float map."""
    if request.loss_fn_config_v2:
        out = {}
        for key, value in request.loss_fn_config_v2.items():
            if value.WhichOneof("value") != "number":
                raise UserError(f"loss_fn_config {key!r}: a text value is not a setting of any loss here")
            out[key] = value.number
        return out
    return dict(request.loss_fn_config)


def tensor(t: pb.Tensor) -> np.ndarray:
    """A request Tensor (dense, or sparse CSR with implicit zeros) as numpy."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise UserError(f"tensor dtype {pb.DType.Name(t.dtype)} is not float32, int64 or int32")
    if t.WhichOneof("encoding") == "sparse_csr":
        values = np.frombuffer(t.sparse_csr.values, dtype)
        crow = np.frombuffer(t.sparse_csr.crow_indices, "<i8")
        col = np.frombuffer(t.sparse_csr.col_indices, "<i8")
        out = np.zeros(list(t.shape), dtype)
        for row in range(len(crow) - 1):
            out[row, col[crow[row]:crow[row + 1]]] = values[crow[row]:crow[row + 1]]
        return out
    flat = np.frombuffer(t.dense, dtype)
    return flat.reshape(list(t.shape)) if len(t.shape) else flat


def token_batch(request: pb.ForwardBackwardRequest) -> TokenBatch:
    """The request's datums: text chunks concatenated, `target_tokens` apart, the other loss inputs as float32."""
    tokens, targets, inputs = [], [], []
    for i, datum in enumerate(request.data):
        ids = []
        for chunk in datum.model_input:
            if chunk.WhichOneof("chunk") != "encoded_text":
                raise UserError(f"datum {i}: a {chunk.WhichOneof('chunk')} chunk; this server trains on text tokens")
            ids.extend(np.frombuffer(chunk.encoded_text.tokens, "<i4").tolist())
        fields = {name: tensor(t) for name, t in datum.loss_fn_inputs.items()}
        if "target_tokens" not in fields:
            raise UserError(f"datum {i}: no target_tokens in loss_fn_inputs")
        tokens.append(ids)
        target = fields.pop("target_tokens").astype(np.int64)
        targets.append((target if target.ndim == 2 else target.reshape(-1)).tolist())  # [N], or [N, K] soft targets
        inputs.append({name: (lambda a: a if a.ndim == 2 else a.reshape(-1))(np.asarray(v, np.float32))
                       for name, v in fields.items()})
    if not tokens:
        raise UserError("forward_backward with no datums")
    try:
        return TokenBatch(tokens, targets, inputs)
    except ValueError as err:
        raise UserError(str(err)) from None


def forward_backward_output(logprobs: Sequence[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A ForwardBackwardOutput: each datum's target logprobs (float32) in ArrayRecords, and the metrics. A datum's
    logprobs are [N], or [N, K] for [N, K] targets: consecutive datums of one trailing shape share a record (the
    SDK reads each record's `trailing_shape`)."""
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    runs: list[list[np.ndarray]] = []
    for lp in (np.asarray(lp, "<f4") for lp in logprobs):
        if runs and runs[-1][0].shape[1:] == lp.shape[1:]:
            runs[-1].append(lp)
        else:
            runs.append([lp])
    for run in runs:
        record = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(run))
        field = record.fields["logprobs"]
        field.dtype = pb.DTYPE_FLOAT32
        field.trailing_shape.extend(run[0].shape[1:])
        field.data = b"".join(lp.tobytes() for lp in run)
        field.offsets = np.cumsum([0] + [lp.size * 4 for lp in run]).astype("<i8").tobytes()
    return out.SerializeToString()


def sample_response(completions: Sequence[Completion], answer: SampleAnswer) -> bytes:
    """A SampleResponse: each sample's tokens, logprobs, stop reason and top k if asked; the prompt's logprobs and
    top k if asked."""
    out = pb.SampleResponse()
    for i, c in enumerate(completions):
        seq = out.sequences.add()
        seq.stop_reason = pb.STOP_REASON_LENGTH if c.finish_reason == "length" else pb.STOP_REASON_STOP
        seq.tokens = np.asarray(c.token_ids, "<i4").tobytes()
        seq.logprobs = np.asarray(c.logprobs, "<f4").tobytes()
        if answer.topk_samples is not None:
            _topk(seq.topk_sampled_logprobs, answer.topk_samples[i])
    if answer.prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(answer.prompt_logprobs, "<f4").tobytes()
    if answer.topk_prompt is not None:
        _topk(out.topk_prompt_logprobs, answer.topk_prompt)
    if answer.target is not None:
        _target(out.target_prompt_logprobs, *answer.target)
    return out.SerializeToString()


def _target(field: pb.Tensor, values: np.ndarray, asked: Target) -> None:
    """The target logprobs in the request's layout: dense, or the same CSR cells it named."""
    field.dtype = pb.DTYPE_FLOAT32
    field.shape.extend(values.shape)
    if asked.csr is None:
        field.dense = np.asarray(values, "<f4").tobytes()
        return
    crow, col = asked.csr
    rows = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
    field.sparse_csr.values = np.asarray(values[rows, col], "<f4").tobytes()
    field.sparse_csr.crow_indices = np.asarray(crow, "<i8").tobytes()
    field.sparse_csr.col_indices = np.asarray(col, "<i8").tobytes()


def _topk(field: pb.TopkLogprobs, topk: Topk) -> None:
    field.length, field.k = topk.token_ids.shape
    field.token_ids = np.asarray(topk.token_ids, "<i4").tobytes()
    field.logprobs = np.asarray(topk.logprobs, "<f4").tobytes()
