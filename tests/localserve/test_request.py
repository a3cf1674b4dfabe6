"""``embedgate.localserve.request``: the native split of a received PredictRequest (native/src/predict_req.rs)
against the reference (protobuf's parse of the whole message, then ``decode_tensor``).

* Differential (hypothesis): requests of every numeric dtype, ``tensor_content`` of the right and wrong length,
  typed values, strings, unknown rank, dim names, duplicated keys, and the same bytes truncated, corrupted or
  extended: the split gives the same model spec, output filter and input values (bit for bit) as the reference,
  and refuses (``InvalidArgumentError``, protobuf's text) exactly the messages protobuf refuses.
* The split takes the numeric ``tensor_content`` inputs out as read-only views of the received bytes; with
  ``EMBEDGATE_SERVE_DIRECT_RUN=off`` it is not used.
* Through serve-local: a request that is not a PredictRequest is INVALID_ARGUMENT (no INTERNAL/UNKNOWN).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import grpc
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import predict_pb2

from embedgate.localserve import request as request_mod
from embedgate.localserve.errors import InvalidArgumentError
from embedgate.localserve.tensors import decode_tensor
from tests.support.native import env_set
from tests.support.servers import LocalServer

needs_native = pytest.mark.skipif(
    request_mod._split_fn() is None, reason="embedgate_native is not built with predict_req (make install)"
)

_NUMERIC = [
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
    np.complex64,
    np.complex128,
    tf.bfloat16.as_numpy_dtype,
]


def _direct(mode: str) -> AbstractContextManager[None]:
    return env_set(request_mod.DIRECT_ENV, mode)


@st.composite
def _tensor(draw: st.DrawFn) -> bytes:
    """A serialized TensorProto: mostly tensor_content of the shape's bytes, sometimes something else."""
    kind = draw(st.sampled_from(["content", "content", "content", "typed", "string", "odd"]))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    n = int(np.prod(shape))
    if kind == "string":
        strings: bytes = tf.make_tensor_proto(
            np.array([b"a"] * n, dtype=object).reshape(shape)
        ).SerializeToString()
        return strings
    dtype = np.dtype(draw(st.sampled_from(_NUMERIC)))
    data = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    t = tf.make_tensor_proto(arr)
    if kind == "typed":
        t = tf.make_tensor_proto(np.arange(n, dtype=np.float32).reshape(shape))
        t.ClearField("tensor_content")
        t.float_val.extend(np.arange(n, dtype=np.float32).tolist()[:3])
    elif kind == "odd":
        change = draw(
            st.sampled_from(["short", "unknown_rank", "dim_name", "negative", "version", "no_shape"])
        )
        if change == "short":
            t.tensor_content = t.tensor_content[: max(0, len(t.tensor_content) - 1)]
        elif change == "unknown_rank":
            t.tensor_shape.unknown_rank = True
        elif change == "dim_name":
            t.tensor_shape.dim.add(size=1, name="d")
        elif change == "negative":
            t.tensor_shape.dim.add(size=-1)
        elif change == "version":
            t.version_number = 3
        else:
            t.ClearField("tensor_shape")
    out: bytes = t.SerializeToString()
    return out


def _entry(key: str, tensor: bytes) -> bytes:
    m = predict_pb2.PredictRequest()
    m.inputs[key].ParseFromString(tensor)
    out: bytes = m.SerializeToString()
    return out


@st.composite
def _raw(draw: st.DrawFn) -> bytes:
    head = predict_pb2.PredictRequest()
    head.model_spec.name = draw(st.text(max_size=8))
    head.model_spec.signature_name = draw(st.text(max_size=5))
    head.output_filter.extend(draw(st.lists(st.text(max_size=4), max_size=2)))
    parts = [head.SerializeToString()]
    keys = draw(st.lists(st.text(max_size=4), max_size=5))
    parts += [_entry(k, draw(_tensor())) for k in keys]
    draw(st.randoms()).shuffle(parts)
    raw = b"".join(parts)
    mutation = draw(st.sampled_from(["none", "none", "truncate", "flip", "append"]))
    if mutation == "truncate" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif mutation == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1 :]
    elif mutation == "append":
        raw += draw(st.binary(min_size=1, max_size=6))
    return raw


def _reference(raw: bytes) -> object:
    """What the reference path makes of ``raw``: the error text, or (spec, filter, alias -> value or error)."""
    try:
        req = request_mod.reference_parse(raw)
    except InvalidArgumentError as exc:
        return exc.message
    values = {
        a: _decoded(lambda a=a: (req.inputs[a].dtype, decode_tensor(req.inputs[a]))) for a in req.inputs
    }
    return req.model_spec.SerializeToString(), list(req.output_filter), values


def _split(raw: bytes) -> object:
    try:
        req, contents = request_mod.parse_predict_request(raw)
    except InvalidArgumentError as exc:
        return exc.message
    values = {
        a: _decoded(lambda a=a: (req.inputs[a].dtype, decode_tensor(req.inputs[a]))) for a in req.inputs
    }
    assert not set(values) & set(contents)
    for alias, (dtype, arr) in contents.items():
        assert not arr.flags.writeable
        values[alias] = _decoded(lambda dtype=dtype, arr=arr: (dtype, arr))
    return req.model_spec.SerializeToString(), list(req.output_filter), values


def _decoded(fn: object) -> object:
    try:
        dtype, arr = fn()  # type: ignore[operator]
    except (ValueError, TypeError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return dtype, arr.dtype.str, arr.shape, arr.tobytes() if arr.dtype != object else arr.tolist()


@needs_native
@settings(max_examples=300, deadline=None)
@given(_raw())
def test_split_equals_the_reference(raw: bytes) -> None:
    assert _split(raw) == _reference(raw)


@needs_native
def test_content_inputs_are_views_of_the_received_bytes() -> None:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "m"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    req.inputs["s"].CopyFrom(tf.make_tensor_proto(np.array([b"a"], dtype=object)))
    raw = req.SerializeToString()
    parsed, contents = request_mod.parse_predict_request(raw)
    assert list(parsed.inputs) == ["s"] and parsed.model_spec.name == "m"
    dtype, value = contents["x"]
    assert dtype == types_pb2.DT_FLOAT and value.tolist() == x.tolist()
    assert np.shares_memory(value, np.frombuffer(raw, np.uint8))
    with _direct("off"):
        parsed, contents = request_mod.parse_predict_request(raw)
    assert not contents and sorted(parsed.inputs) == ["s", "x"]


@needs_native
def test_duplicated_keys_go_to_protobuf_which_keeps_the_last() -> None:
    raw = _entry("x", tf.make_tensor_proto(np.array([1], np.float32)).SerializeToString()) + _entry(
        "x", tf.make_tensor_proto(np.array([2], np.float32)).SerializeToString()
    )
    parsed, contents = request_mod.parse_predict_request(raw)
    assert not contents and decode_tensor(parsed.inputs["x"]).tolist() == [2.0]


@pytest.mark.integration
@pytest.mark.parametrize("raw", [b"\xff\xff", b"\x12\x05\x0a\x01x"])
def test_bytes_that_do_not_parse_are_invalid_argument(server: LocalServer, raw: bytes) -> None:
    with grpc.insecure_channel(server.target) as ch:
        call = ch.unary_unary("/tensorflow.serving.PredictionService/Predict")
        with pytest.raises(grpc.RpcError) as exc:
            call(raw, timeout=30)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Could not parse the PredictRequest" in (exc.value.details() or "")
