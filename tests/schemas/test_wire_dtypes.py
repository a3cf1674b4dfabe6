"""schemas.wire with the unique_rows entry's dtypes: int32, float16 and bfloat16 (Bfloat16Bits) tensor_content parse
to the message protobuf builds; bfloat16_bits rounds as TensorFlow's cast does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from schemas.proto import tfs_pb2
from schemas.wire import bfloat16_bits, predict_request


@settings(max_examples=100, deadline=None)
@given(
    ints=hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=20)),
    halves=hnp.arrays(np.float16, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=20)),
    floats=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=20)),
)
def test_int32_float16_bfloat16_frames_parse_to_protobufs_message(
    ints: np.ndarray, halves: np.ndarray, floats: np.ndarray
) -> None:
    bf = bfloat16_bits(floats)
    got = tfs_pb2.PredictRequest.FromString(
        predict_request("m", "s", [("i", ints), ("h", halves), ("b", bf)])
    )
    want = tfs_pb2.PredictRequest()
    want.model_spec.name, want.model_spec.signature_name = "m", "s"
    for key, arr, dtype, raw in (
        ("i", ints, tfs_pb2.DT_INT32, ints.astype("<i4").tobytes()),
        ("h", halves, tfs_pb2.DT_HALF, halves.astype("<f2").tobytes()),
        ("b", floats, tfs_pb2.DT_BFLOAT16, bf.view(np.ndarray).astype("<u2").tobytes()),
    ):
        t = want.inputs[key]
        t.dtype = dtype  # type: ignore[assignment]
        for d in arr.shape:
            t.tensor_shape.dim.add(size=d)
        t.tensor_content = raw
    assert got == want


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, st.integers(0, 200), elements=st.floats(width=32, allow_nan=True)))
def test_bfloat16_bits_round_as_tensorflow_does(values: np.ndarray) -> None:
    import ml_dtypes  # TensorFlow's own bfloat16 numpy type (TF depends on it)

    got = bfloat16_bits(values).view(np.ndarray)
    want = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(values)
    assert (got[finite] == want[finite]).all()
    assert np.isnan(got.view(ml_dtypes.bfloat16).astype(np.float32)[~finite]).all()
