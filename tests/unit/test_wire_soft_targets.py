"""[N, K] target_tokens and weights through the wire as the official SDK (tinker 0.38) writes and reads them: a
request of soft-target datums becomes a TokenBatch of [N, K] targets and weights, and each datum's [N, K] logprobs
come back to the SDK in that shape beside [N] ones. Fails on the old main, which flattened every field to [N * K]
and wrote one record without a trailing shape."""

from __future__ import annotations

import numpy as np
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output

from orchestration.service import wire


def test_a_soft_target_request_reads_as_n_by_k():
    targets = np.arange(12).reshape(4, 3)
    weights = np.full((4, 3), 0.25, np.float32)
    datum = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
                        loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(targets),
                                        "weights": types.TensorData.from_numpy(weights)})
    plain = types.Datum(model_input=types.ModelInput.from_ints([5, 6]),
                        loss_fn_inputs={"target_tokens": [6, 7], "weights": [1.0, 1.0]})
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum, plain], loss_fn="cross_entropy"),
        model_id="m", seq_id=1)
    batch = wire.token_batch(forward_backward_request_to_proto(request))
    assert np.array_equal(batch.targets[0], targets) and batch.targets[1] == [6, 7]
    assert batch.inputs[0]["weights"].shape == (4, 3) and batch.inputs[1]["weights"].shape == (2,)
    assert batch.width == 3


def test_n_by_k_logprobs_reach_the_sdk_in_their_shape():
    soft, plain, soft2 = (np.arange(12, dtype=np.float32).reshape(4, 3), np.arange(2, dtype=np.float32),
                          -np.ones((2, 3), np.float32))
    out = deserialize_forward_backward_output(wire.forward_backward_output([soft, soft2, plain], {"loss:sum": 1.0}))
    shapes = [o["logprobs"].shape for o in out.loss_fn_outputs]
    assert shapes == [[4, 3], [2, 3], [2]], shapes
    assert np.array_equal(out.loss_fn_outputs[0]["logprobs"].to_numpy(), soft)
    assert out.loss_fn_outputs[2]["logprobs"].tolist() == [0.0, 1.0]
