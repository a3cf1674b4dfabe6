"""gRPC Predict features read natively from the request's bytes (``gateway.native.tensor_features``,
native/src/tensor_features.rs) against the reference ``gateway.grpc_front.features.batch_from_tensors`` of the
parsed request.

On generated manifests and requests (int32 and int64 ids, ``[B]`` and ``[B, 1]`` singles, ``-1``-padded multis
over and under ``max_ids``, weights sent or not, NaN weights on padding and on ids, dense ``[B, dim]``) with some
requests spoilt (a feature missing, an unknown input, a batch size that differs, a float64 tensor, a duplicated
input) and some tensors written as packed ``*_val`` fields (the dtype's own field with one value per element, as
``tf.make_tensor_proto`` writes one-element tensors, which the reader takes; another field, or fewer values than
elements, which it leaves to the reference) or as unpacked records (one run, as Go's protobuf writes them, which it
takes; runs split by another field, or packed and unpacked values mixed, which it leaves): whenever the native reader answers, the reference accepts the request
and gives the same batch bit for bit; whenever the reference accepts a request of the forms the reader takes, the
reader answers too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.errors import InvalidArgument
from gateway.features import FeatureBatch
from gateway.grpc_front.features import batch_from_tensors
from gateway.grpc_front.servicer import TensorInputs
from schemas.manifest import FeatureKind, Manifest
from schemas.proto import tfs_pb2
from schemas.wire import predict_request_for
from tests.gateway.test_native_plan import _manifest
from tests.support.native import native_mode

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._module(), "tensor_features"),
    reason="embedgate_native is not built with the gRPC feature reader (make install)",
)

_SPEC = tfs_pb2.ModelSpec(name="m")
_ID = st.one_of(st.just(-1), st.integers(0, 12), st.integers(-(2**31), 2**31 - 1))
_WEIGHT = st.one_of(st.floats(-4, 4, width=32), st.just(float("nan")))
_SPOIL = [
    "missing",
    "unknown",
    "size",
    "float64",
    "packed",
    "packed",
    "packed_other",
    "packed_short",
    "unpacked",
    "unpacked",
    "unpacked_split",
    "unpacked_mixed",
    "twice",
]
_FIELD = {np.dtype(np.int64): "int64_val", np.dtype(np.int32): "int_val", np.dtype(np.float32): "float_val"}
_DTYPE = {"int64_val": tfs_pb2.DT_INT64, "int_val": tfs_pb2.DT_INT32, "float_val": tfs_pb2.DT_FLOAT}
_NUMBER = {"float_val": 5, "int_val": 7, "int64_val": 10}


def _varint(v: int) -> bytes:
    v &= 2**64 - 1  # negative ints are written as their 64-bit two's complement, int32 too
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _unpacked(field: str, values: list[Any]) -> bytes:
    """``values`` as unpacked records of ``field`` (each its tag, then the value), as Go's protobuf writes them."""
    if field == "float_val":
        return b"".join(_varint(5 << 3 | 5) + np.float32(v).tobytes() for v in values)
    return b"".join(_varint(_NUMBER[field] << 3) + _varint(int(v)) for v in values)


def _entry(name: str, tensor: bytes) -> bytes:
    """One ``inputs`` entry of a PredictRequest holding the serialized TensorProto ``tensor``."""
    key = name.encode()
    body = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(tensor)) + tensor
    return b"\x12" + _varint(len(body)) + body


def _inputs(data: st.DataObject, manifest: Manifest) -> tuple[list[tuple[str, np.ndarray]], bool]:
    """A request's inputs and whether they are all of the forms the native reader takes."""
    size = data.draw(st.integers(1, 5))
    out: list[tuple[str, np.ndarray]] = []
    for f in manifest.sparse_features:
        if f.kind is FeatureKind.MULTI:
            shape: tuple[int, ...] = (size, data.draw(st.integers(1, 14)))
        else:
            shape = data.draw(st.sampled_from([(size,), (size, 1)]))
        n = int(np.prod(shape))
        values = data.draw(st.lists(_ID, min_size=n, max_size=n))
        dtype = data.draw(st.sampled_from([np.int64, np.int32]))
        out.append((f.name, np.array(values, dtype).reshape(shape)))
        if f.weights and data.draw(st.booleans()):
            w = data.draw(st.lists(_WEIGHT, min_size=n, max_size=n))
            out.append((f.weights, np.array(w, np.float32).reshape(shape)))
    for d in manifest.dense_features:
        out.append((d.name, np.full((size, d.dim), 0.5, np.float32)))
    return out, True


def _spoil(data: st.DataObject, inputs: list[tuple[str, np.ndarray]]) -> tuple[bytes, bool]:
    how = data.draw(st.sampled_from([None, None, None, *_SPOIL]))
    plain = True
    k = data.draw(st.integers(0, len(inputs) - 1))
    suffix = b""
    if how == "missing":
        del inputs[k]
    elif how == "unknown":
        inputs.append(("nope", np.zeros(1, np.int64)))
    elif how == "size":
        name, a = inputs[k]
        inputs[k] = (name, np.concatenate([a, a]))
    elif how == "float64":
        name, a = inputs[k]
        t = tfs_pb2.TensorProto(dtype=tfs_pb2.DT_DOUBLE, tensor_content=a.astype("<f8").tobytes())
        t.tensor_shape.dim.extend(tfs_pb2.TensorShapeProto.Dim(size=s) for s in a.shape)
        del inputs[k]
        suffix = tfs_pb2.PredictRequest(inputs={name: t}).SerializeToString()
        plain = False
    elif how is not None and how.startswith("packed"):
        name, a = inputs[k]
        field = _FIELD[a.dtype]
        dtype = _DTYPE[field]
        values = a.reshape(-1).tolist()
        if how == "packed_other":  # int64 ids in int_val, int32 ids in int64_val, floats in int64_val
            field = {"int64_val": "int_val", "int_val": "int64_val", "float_val": "int64_val"}[field]
            values = [int(v) if v == v else 0 for v in values]
        elif how == "packed_short":  # TensorProto's "the last value repeats"
            values = values[:1]
        t = tfs_pb2.TensorProto(dtype=dtype)
        t.tensor_shape.dim.extend(tfs_pb2.TensorShapeProto.Dim(size=s) for s in a.shape)
        getattr(t, field).extend(values)
        del inputs[k]
        suffix = tfs_pb2.PredictRequest(inputs={name: t}).SerializeToString()
        plain = how == "packed" or (how == "packed_short" and a.size == 1)
    elif how is not None and how.startswith("unpacked"):
        name, a = inputs[k]
        field = _FIELD[a.dtype]
        values = a.reshape(-1).tolist()
        head = tfs_pb2.TensorProto(dtype=_DTYPE[field])
        head.tensor_shape.dim.extend(tfs_pb2.TensorShapeProto.Dim(size=s) for s in a.shape)
        if how == "unpacked":  # one run of records after the dtype and the shape: the reader takes it
            tensor = head.SerializeToString() + _unpacked(field, values)
            plain = True
        elif how == "unpacked_split":  # the shape between the first record and the others: a second run
            shape = tfs_pb2.TensorProto(tensor_shape=head.tensor_shape).SerializeToString()
            dtype = tfs_pb2.TensorProto(dtype=head.dtype).SerializeToString()
            tensor = _unpacked(field, values[:1]) + shape + _unpacked(field, values[1:]) + dtype
            plain = a.size == 1
        else:  # all but the last value packed, the last one a record: protobuf joins them; the reader declines
            packed = tfs_pb2.TensorProto()
            getattr(packed, field).extend(values[:-1])
            tensor = head.SerializeToString() + packed.SerializeToString() + _unpacked(field, values[-1:])
            plain = False
        del inputs[k]
        suffix = _entry(name, tensor)
    elif how == "twice":
        inputs.append(inputs[k])
        plain = (
            False  # protobuf keeps the last of a repeated map key; the native reader leaves it to protobuf
        )
    return predict_request_for(_SPEC, inputs, suffix), plain


def _same(a: FeatureBatch, b: FeatureBatch) -> None:
    assert a.size == b.size
    assert a.sparse.keys() == b.sparse.keys() and list(a.dense) == list(b.dense)
    for name, x in a.sparse.items():
        y = b.sparse[name]
        for u, v in ((x.ids, y.ids), (x.row_splits, y.row_splits), (x.weights, y.weights)):
            if u is None or v is None:
                assert u is None and v is None, name
            else:
                assert u.dtype == v.dtype, name
                assert np.array_equal(u, v, equal_nan=u.dtype.kind == "f"), name
    for name, x in a.dense.items():
        assert x.dtype == b.dense[name].dtype and x.shape == b.dense[name].shape
        np.testing.assert_array_equal(x, b.dense[name])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_native_reader_equals_the_reference_or_declines(data: st.DataObject) -> None:
    manifest = data.draw(_manifest())
    inputs, _ = _inputs(data, manifest)
    raw, plain = _spoil(data, inputs)
    parsed = tfs_pb2.PredictRequest.FromString(raw)
    ref: FeatureBatch | None
    try:
        ref = batch_from_tensors(parsed.inputs, manifest)
    except InvalidArgument:
        ref = None
    got = native.tensor_features(raw, manifest)
    if got is not None:
        assert ref is not None, "the native reader accepted what the reference refuses"
        _same(got, ref)
    elif ref is not None:
        assert not plain, "the native reader declined a request of the forms it takes"


def test_tensor_inputs_read_natively_and_by_the_reference_alike() -> None:
    manifest = Manifest.model_validate(
        {
            "model_name": "m",
            "version": 1,
            "tables": [{"name": "t", "dim": 2}],
            "sparse_features": [
                {"name": "u", "table": "t"},
                {
                    "name": "h",
                    "table": "t",
                    "kind": "multi",
                    "combiner": "mean",
                    "weights": "hw",
                    "max_ids": 3,
                },
            ],
            "dense_features": [{"name": "d", "dim": 1}],
            "partition": {"num_shards": 2},
            "entry": {"outputs": [{"name": "y", "shape": [1]}]},
        }
    )
    inputs: list[tuple[str, Any]] = [
        ("u", np.array([4, 5], np.int32)),
        ("h", np.array([[1, -1, 2], [-1, -1, -1]], np.int64)),
        ("hw", np.array([[0.5, np.nan, 2.0], [np.nan, 1, 1]], np.float32)),
        ("d", np.array([0.25, 1.5], np.float32)),
    ]
    raw = predict_request_for(_SPEC, inputs)
    tensors = tfs_pb2.PredictRequest.FromString(raw).inputs
    fast = TensorInputs(tensors, None, raw).features(manifest)
    with native_mode("off"):
        ref = TensorInputs(tensors, None, raw).features(manifest)
    _same(fast, ref)
    assert fast.sparse["h"].ids.tolist() == [1, 2] and fast.sparse["h"].row_splits.tolist() == [0, 2, 2]
    assert fast.sparse["h"].weights is not None and fast.sparse["h"].weights.tolist() == [0.5, 2.0]
    assert native.tensor_features(raw, manifest) is not None
    over = predict_request_for(
        _SPEC, [*inputs[:1], ("h", np.array([[1, 2, 3, 4], [1, 2, 3, 4]], np.int64)), inputs[3]]
    )
    assert native.tensor_features(over, manifest) is None  # more than max_ids: the reference words the error
    with pytest.raises(InvalidArgument, match="more than max_ids 3"):
        TensorInputs(tfs_pb2.PredictRequest.FromString(over).inputs, None, over).features(manifest)
