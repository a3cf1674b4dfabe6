"""schemas.wire: hand-framed PredictRequest bytes parse to the message protobuf builds, field for field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.proto import tfs_pb2
from schemas.wire import predict_request


def _reference(model: str, signature: str, inputs: list[tuple[str, np.ndarray]]) -> tfs_pb2.PredictRequest:
    req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name=model, signature_name=signature))
    for key, a in inputs:
        t = req.inputs[key]
        t.dtype = tfs_pb2.DT_INT64 if a.dtype.kind == "i" else tfs_pb2.DT_FLOAT
        t.tensor_shape.dim.extend(tfs_pb2.TensorShapeProto.Dim(size=s) for s in a.shape)
        t.tensor_content = a.astype("<i8" if a.dtype.kind == "i" else "<f4").tobytes()
    return req


@settings(max_examples=60, deadline=None)
@given(
    rows=st.sampled_from([0, 1, 2, 127, 128, 300, 16384]),  # varint lengths of 1, 2 and 3+ bytes
    dim=st.integers(1, 70),
    key=st.text(min_size=1, max_size=140),
    model=st.text(max_size=20),
)
def test_predict_request_parses_to_the_protobuf_built_message(
    rows: int, dim: int, key: str, model: str
) -> None:
    rng = np.random.default_rng(rows * 100 + dim)
    ids = rng.integers(-(2**63), 2**63 - 1, rows, dtype=np.int64)
    values = rng.standard_normal((rows, dim)).astype(np.float32)
    inputs = [("ids", ids), (key, values), ("seqs", np.zeros(rows, np.int64))]
    got = tfs_pb2.PredictRequest.FromString(predict_request(model, "upsert_t", inputs))
    want = _reference(model, "upsert_t", inputs)
    assert got == want
    assert (
        np.frombuffer(got.inputs[key].tensor_content, "<f4").reshape(rows, dim).tobytes() == values.tobytes()
    )


def test_non_contiguous_and_big_endian_arrays_are_written_little_endian_row_major() -> None:
    a = np.arange(24, dtype=">f4").reshape(4, 6)[:, ::2]  # strided view, big-endian
    ids = np.arange(4, dtype=">i8")
    got = tfs_pb2.PredictRequest.FromString(predict_request("m", "s", [("v", a), ("ids", ids)]))
    assert got == _reference("m", "s", [("v", np.ascontiguousarray(a, "<f4")), ("ids", ids.astype("<i8"))])
    assert list(got.inputs["v"].tensor_shape.dim) == [
        tfs_pb2.TensorShapeProto.Dim(size=4),
        tfs_pb2.TensorShapeProto.Dim(size=3),
    ]


def test_suffix_fields_merge_into_the_request() -> None:
    extra = tfs_pb2.PredictRequest()
    extra.inputs["stream_offsets"].CopyFrom(
        tfs_pb2.TensorProto(dtype=tfs_pb2.DT_INT64, tensor_content=np.array([7], "<i8").tobytes())
    )
    body = predict_request("m", "s", [("ids", np.array([1], np.int64))], extra.SerializeToString())
    got = tfs_pb2.PredictRequest.FromString(body)
    assert set(got.inputs) == {"ids", "stream_offsets"}
    assert got.inputs["stream_offsets"] == extra.inputs["stream_offsets"]


def test_other_dtypes_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="'names'.*dtype <U1"):
        predict_request("m", "s", [("names", np.array(["a"]))])
