"""schemas.wire.predict_request_for, the framing of the pooled entry's request (every input float32
``tensor_content``): its bytes parse to exactly the message the gateway used to fill field by field and serialize with
protobuf."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from schemas.proto import tfs_pb2
from schemas.tensors import to_ndarray
from schemas.wire import predict_request_for

_names = st.text(min_size=0, max_size=12)
_arrays = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.int64]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
    elements={"allow_nan": False, "allow_infinity": False, "min_value": -1e6, "max_value": 1e6},
)


def entry_request(spec: tfs_pb2.ModelSpec, inputs: Mapping[str, np.ndarray]) -> bytes:
    """A pooled entry's request: every input as float32."""
    return predict_request_for(spec, [(k, np.asarray(a, dtype=np.float32)) for k, a in inputs.items()])


def _fill(t: tfs_pb2.TensorProto, arr: np.ndarray) -> None:
    """The reference: ``t`` filled field by field by protobuf, float32 ``tensor_content`` (how the gateway built the
    message before it was framed by hand)."""
    t.dtype = tfs_pb2.DataType.DT_FLOAT
    for d in arr.shape:
        t.tensor_shape.dim.add(size=d)
    t.tensor_content = np.ascontiguousarray(arr, dtype=np.float32).tobytes()


@settings(max_examples=150, deadline=None)
@given(
    inputs=st.dictionaries(_names, _arrays, max_size=5),
    name=st.text(max_size=8),
    version=st.one_of(st.none(), st.integers(0, 2**40)),
    signature=st.text(max_size=8),
)
def test_bytes_parse_to_the_message_protobuf_builds(
    inputs: dict[str, np.ndarray], name: str, version: int | None, signature: str
) -> None:
    spec = tfs_pb2.ModelSpec(name=name, signature_name=signature)
    if version is not None:
        spec.version.value = version
    want = tfs_pb2.PredictRequest(model_spec=spec)
    for k, arr in inputs.items():
        _fill(want.inputs[k], arr)
    got = tfs_pb2.PredictRequest.FromString(entry_request(spec, inputs))
    assert got == want
    for k, arr in inputs.items():  # the values themselves, through the decoder the backends' answers use
        np.testing.assert_array_equal(to_ndarray(got.inputs[k]), np.asarray(arr, dtype=np.float32))


def test_large_lengths_use_multi_byte_varints() -> None:
    """A tensor over 2**21 bytes needs a 4-byte length; the message still parses and keeps every value."""
    arr = np.arange(600_000, dtype=np.float32).reshape(3000, 200)
    got = tfs_pb2.PredictRequest.FromString(entry_request(tfs_pb2.ModelSpec(name="m"), {"x": arr}))
    np.testing.assert_array_equal(to_ndarray(got.inputs["x"]), arr)
    assert got.model_spec.name == "m"
