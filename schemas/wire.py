"""Serialized ``PredictRequest`` bytes with each array's bytes copied once: the updater's PS writes and the gateway's
entry requests.

Building a request with protobuf objects copies every row four times (``ndarray.tobytes``, the ``TensorProto``
field, ``CopyFrom`` into the request's map, ``SerializeToString``); for a 16 384-row dim-64 upsert that is 16 MB of
copies per call. :func:`predict_request` instead lets protobuf serialize everything small (the model spec, each
tensor's dtype and shape) and writes the protobuf wire format only around each array's raw bytes: the ``inputs``
map entry (key, value) and the ``tensor_content`` field, each a tag and a varint length. The arrays are then copied
once, by ``bytes.join``; for a large request that also keeps the GIL-holding work short (one join instead of several
serializations of the whole payload). Field numbers come from the generated descriptors, not from constants here.

The result parses (``PredictRequest.FromString``) to exactly the message protobuf would have built with
``tensor_content`` set to the array's little-endian bytes (``tests/schemas/test_wire.py`` and, for the gateway's
float32 entry requests, ``tests/gateway/test_predict_wire.py`` check it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.proto import tfs_pb2

__all__ = ["Bfloat16Bits", "bfloat16_bits", "predict_request", "predict_request_for"]

_LEN = 2  # wire type of length-delimited fields
_VARINT = 0  # wire type of integer fields
_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def _tag(number: int, wire_type: int = _LEN) -> bytes:
    return _varint((number << 3) | wire_type)


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _number(message: Any, field: str) -> int:
    return int(message.DESCRIPTOR.fields_by_name[field].number)


_INPUTS = _tag(_number(tfs_pb2.PredictRequest, "inputs"))
_ENTRY = tfs_pb2.PredictRequest.DESCRIPTOR.fields_by_name["inputs"].message_type
_KEY = _tag(_ENTRY.fields_by_name["key"].number)
_VALUE = _tag(_ENTRY.fields_by_name["value"].number)
_CONTENT = _tag(_number(tfs_pb2.TensorProto, "tensor_content"))
_SHAPE = _tag(_number(tfs_pb2.TensorProto, "tensor_shape"))
_DIM = _tag(_number(tfs_pb2.TensorShapeProto, "dim"))
_SIZE = _tag(_number(tfs_pb2.TensorShapeProto.Dim, "size"), _VARINT)
# ``dtype: <value>`` of each dtype written here (both enum values are non-zero, so always written)
_DTYPE = {
    d: _tag(_number(tfs_pb2.TensorProto, "dtype"), _VARINT) + _varint(d)
    for d in (
        tfs_pb2.DT_INT64,
        tfs_pb2.DT_FLOAT,
        tfs_pb2.DT_INT32,
        tfs_pb2.DT_HALF,
        tfs_pb2.DT_BFLOAT16,
    )
}


class Bfloat16Bits(np.ndarray):  # a view subclass marking uint16 data as bfloat16
    """A uint16 array holding bfloat16 values (the upper 16 bits of float32s): numpy has no bfloat16 dtype, so
    :func:`predict_request_for` writes an array of this class as ``DT_BFLOAT16``. Make one with
    :func:`bfloat16_bits`."""


def bfloat16_bits(values: npt.ArrayLike) -> Bfloat16Bits:
    """float32 ``values`` rounded to bfloat16 (to nearest, ties to even, as TensorFlow's float32 -> bfloat16 cast;
    NaN stays NaN), as :class:`Bfloat16Bits` of the same shape."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(
        np.uint16
    )
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)  # quiet NaN, sign kept
    out: Bfloat16Bits = rounded.view(Bfloat16Bits)
    return out


def _dim(size: int) -> bytes:
    """One ``TensorShapeProto.dim`` field; a size of 0 is the default, left out as protobuf does."""
    body = _SIZE + _varint(size) if size else b""
    return _DIM + _varint(len(body)) + body


def _tensor_parts(key: str, array: npt.NDArray[Any]) -> list[bytes | memoryview]:
    """The ``inputs`` map entry of ``key`` -> ``array``, as pieces to join: int32 stays DT_INT32, float16 DT_HALF, a
    :class:`Bfloat16Bits` DT_BFLOAT16; any other integer array is written as DT_INT64 and any other float as
    DT_FLOAT."""
    if isinstance(array, Bfloat16Bits):
        dtype, raw = tfs_pb2.DT_BFLOAT16, np.ascontiguousarray(array.view(np.ndarray), dtype="<u2")
    elif array.dtype == np.int32:
        dtype, raw = tfs_pb2.DT_INT32, np.ascontiguousarray(array, dtype="<i4")
    elif array.dtype == np.float16:
        dtype, raw = tfs_pb2.DT_HALF, np.ascontiguousarray(array, dtype="<f2")
    elif array.dtype.kind == "i":
        dtype, raw = tfs_pb2.DT_INT64, np.ascontiguousarray(array, dtype="<i8")
    elif array.dtype.kind == "f":
        dtype, raw = tfs_pb2.DT_FLOAT, np.ascontiguousarray(array, dtype="<f4")
    else:
        raise TypeError(f"input {key!r}: int or float array expected, got dtype {array.dtype}")
    # dtype and shape framed here too (protobuf objects cost ~5 us per tensor, most of a small request); the shape is
    # the array's own (ascontiguousarray turns a 0-d array into a 1-d one); a scalar's shape stays unset
    meta = _DTYPE[dtype]
    if array.ndim:
        dims = b"".join(map(_dim, array.shape))
        meta += _SHAPE + _varint(len(dims)) + dims
    nbytes = raw.nbytes
    # an empty tensor_content is left out, as protobuf leaves out an empty proto3 field
    if nbytes:
        meta += _CONTENT + _varint(nbytes)
    name = key.encode()
    head = _KEY + _varint(len(name)) + name + _VALUE + _varint(len(meta) + nbytes) + meta
    entry = _INPUTS + _varint(len(head) + nbytes) + head
    return (
        [entry, raw.data] if nbytes else [entry]
    )  # a C-contiguous array's buffer: joined without a copy first


def predict_request(
    model: str,
    signature: str,
    inputs: Sequence[tuple[str, npt.NDArray[Any]]],
    suffix: bytes = b"",
) -> bytes:
    """A serialized ``PredictRequest`` for ``model``'s ``signature`` with ``inputs`` (name, array of a dtype :func:`_tensor_parts` takes;
    ``tensor_content``, little-endian) and ``suffix`` appended (serialized fields of a ``PredictRequest``, e.g. more
    ``inputs`` entries: protobuf merges concatenated messages)."""
    return predict_request_for(tfs_pb2.ModelSpec(name=model, signature_name=signature), inputs, suffix)


def predict_request_for(
    model_spec: tfs_pb2.ModelSpec,
    inputs: Sequence[tuple[str, npt.NDArray[Any]]],
    suffix: bytes = b"",
) -> bytes:
    """:func:`predict_request` with a whole ``model_spec`` (a version or version label too)."""
    parts: list[bytes | memoryview] = [tfs_pb2.PredictRequest(model_spec=model_spec).SerializeToString()]
    for key, array in inputs:
        parts.extend(_tensor_parts(key, array))
    parts.append(suffix)
    return b"".join(parts)
