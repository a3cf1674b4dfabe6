"""A serialized ``PredictRequest`` of float32 tensors, written straight from the arrays' bytes.

The entry model's request is the pooled embeddings plus the dense features, all float32 ``tensor_content``. Filling
a protobuf message copies every array twice (``tobytes``, then into the message) and serializing it copies it again,
each in one C call that holds the GIL: for a 160 MB request that is ~0.45 s during which the gateway's event loop
cannot run. Here the message's framing (a few bytes per tensor: tags, lengths, the shape) is written by hand and
joined with the arrays' own buffers, one copy in all; the backend call then sends the bytes as they are.

Wire facts used (tensorflow/core/framework/tensor.proto, tensor_shape.proto; tensorflow_serving/apis/predict.proto):
``PredictRequest``: model_spec = 1, inputs = 2 (map<string, TensorProto>: entry key = 1, value = 2);
``TensorProto``: dtype = 1, tensor_shape = 2, tensor_content = 4; ``TensorShapeProto``: dim = 2; ``Dim``: size = 1.
Fields at their default (0, empty) are left out, as protobuf itself does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from schemas.proto import tfs_pb2

__all__ = ["predict_request_bytes"]

_LEN: Final = 2  # wire type: length-delimited
_VARINT: Final = 0
_ONE_BYTE: Final = tuple(bytes((n,)) for n in range(0x80))


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


_SPEC: Final = _tag(1, _LEN)  # PredictRequest.model_spec
_INPUT: Final = _tag(2, _LEN)  # PredictRequest.inputs (a map entry)
_KEY: Final = _tag(1, _LEN)  # map entry key
_VALUE: Final = _tag(2, _LEN)  # map entry value
_DTYPE_FLOAT: Final = _tag(1, _VARINT) + _varint(int(tfs_pb2.DataType.DT_FLOAT))  # TensorProto.dtype
_SHAPE: Final = _tag(2, _LEN)  # TensorProto.tensor_shape
_DIM: Final = _tag(2, _LEN)  # TensorShapeProto.dim
_SIZE: Final = _tag(1, _VARINT)  # TensorShapeProto.Dim.size
_CONTENT: Final = _tag(4, _LEN)  # TensorProto.tensor_content
_EMPTY_DIM: Final = _DIM + _varint(0)


def _dim(size: int) -> bytes:
    if not size:
        return _EMPTY_DIM  # size 0 is the default: not written
    size_field = _SIZE + _varint(size)
    return _DIM + _varint(len(size_field)) + size_field


def predict_request_bytes(model_spec: tfs_pb2.ModelSpec, inputs: Mapping[str, np.ndarray]) -> bytes:
    """The serialized ``PredictRequest(model_spec=model_spec, inputs={name: float32 tensor_content of arr})``; what
    filling the message and ``SerializeToString`` give, parsed back (map entries in ``inputs``' order)."""
    spec = model_spec.SerializeToString()
    parts: list[Any] = [
        _SPEC + _varint(len(spec)) + spec
    ]  # present even when empty, as assigning it makes it
    for name, arr in inputs.items():
        shape = np.shape(arr)
        data = np.ascontiguousarray(
            arr, dtype=np.float32
        )  # (a 0-d array comes back 1-d: its shape is ``shape``)
        nbytes = data.nbytes
        head = _DTYPE_FLOAT
        if shape:
            dims = b"".join(map(_dim, shape))
            head += _SHAPE + _varint(len(dims)) + dims
        if nbytes:
            head += _CONTENT + _varint(nbytes)
        tensor_len = len(head) + nbytes
        key = name.encode()
        entry = (_KEY + _varint(len(key)) + key if key else b"") + _VALUE + _varint(tensor_len)
        parts.append(_INPUT + _varint(len(entry) + tensor_len) + entry + head)
        if nbytes:
            parts.append(
                data
            )  # a C-contiguous array is a flat buffer of its bytes: joined without a copy first
    return b"".join(parts)
