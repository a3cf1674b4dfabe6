"""Serialized ``PredictRequest`` bytes for PS writes, with each array's bytes copied once.

Building a request with protobuf objects copies every row four times (``ndarray.tobytes``, the ``TensorProto``
field, ``CopyFrom`` into the request's map, ``SerializeToString``); for a 16 384-row dim-64 upsert that is 16 MB of
copies per call. :func:`predict_request` instead lets protobuf serialize everything small (the model spec, each
tensor's dtype and shape) and writes the protobuf wire format only around each array's raw bytes: the ``inputs``
map entry (key, value) and the ``tensor_content`` field, each a tag and a varint length. The arrays are then copied
once, by ``bytes.join``. Field numbers come from the generated descriptors, not from constants here.

The result parses (``PredictRequest.FromString``) to exactly the message protobuf would have built with
``tensor_content`` set to the array's little-endian bytes (``tests/updater/test_wire.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from schemas.proto import tfs_pb2

__all__ = ["predict_request"]

_LEN = 2  # wire type of length-delimited fields


def _tag(number: int) -> bytes:
    return _varint((number << 3) | _LEN)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


_INPUTS = _tag(tfs_pb2.PredictRequest.DESCRIPTOR.fields_by_name["inputs"].number)
_ENTRY = tfs_pb2.PredictRequest.DESCRIPTOR.fields_by_name["inputs"].message_type
_KEY = _tag(_ENTRY.fields_by_name["key"].number)
_VALUE = _tag(_ENTRY.fields_by_name["value"].number)
_CONTENT = _tag(tfs_pb2.TensorProto.DESCRIPTOR.fields_by_name["tensor_content"].number)


def _tensor_parts(
    key: str, array: npt.NDArray[np.int64] | npt.NDArray[np.float32]
) -> list[bytes | memoryview]:
    """The ``inputs`` map entry of ``key`` -> ``array`` (int64 or float32), as pieces to join."""
    if array.dtype.kind == "i":
        dtype, raw = tfs_pb2.DT_INT64, np.ascontiguousarray(array, dtype="<i8")
    elif array.dtype.kind == "f":
        dtype, raw = tfs_pb2.DT_FLOAT, np.ascontiguousarray(array, dtype="<f4")
    else:
        raise TypeError(f"input {key!r}: int64 or float32 array expected, got dtype {array.dtype}")
    shape = tfs_pb2.TensorShapeProto(dim=[tfs_pb2.TensorShapeProto.Dim(size=int(s)) for s in raw.shape])
    meta = tfs_pb2.TensorProto(dtype=dtype, tensor_shape=shape).SerializeToString()
    content = raw.reshape(-1).view(np.uint8).data
    # an empty tensor_content is left out, as protobuf leaves out an empty proto3 field
    field: list[bytes | memoryview] = [_CONTENT, _varint(content.nbytes), content] if content.nbytes else []
    field_len = sum(memoryview(p).nbytes for p in field)
    name = key.encode()
    head = b"".join([_KEY, _varint(len(name)), name, _VALUE, _varint(len(meta) + field_len), meta])
    return [_INPUTS, _varint(len(head) + field_len), head, *field]


def predict_request(
    model: str,
    signature: str,
    inputs: Sequence[tuple[str, npt.NDArray[np.int64] | npt.NDArray[np.float32]]],
    suffix: bytes = b"",
) -> bytes:
    """A serialized ``PredictRequest`` for ``model``'s ``signature`` with ``inputs`` (name, int64 or float32 array;
    ``tensor_content``, little-endian) and ``suffix`` appended (serialized fields of a ``PredictRequest``, e.g. more
    ``inputs`` entries: protobuf merges concatenated messages)."""
    spec = tfs_pb2.PredictRequest(
        model_spec=tfs_pb2.ModelSpec(name=model, signature_name=signature)
    ).SerializeToString()
    parts: list[bytes | memoryview] = [spec]
    for key, array in inputs:
        parts.extend(_tensor_parts(key, array))
    parts.append(suffix)
    return b"".join(parts)
