"""``TensorProto`` <-> numpy, as TF Serving encodes them. Pure functions (TensorFlow only for the dtype tables).

Decoding accepts typed ``*_val`` fields and ``tensor_content`` (``tf.make_ndarray``: fewer values than elements
are padded with the last value, as TF's ``Tensor::FromProto`` does). Encoding mirrors ``Tensor::AsProtoField``
(typed fields, the default) or ``Tensor::AsProtoTensorContent`` (``--enable_serialization_as_tensor_content``);
string tensors always use ``string_val`` (TF's content encoding of strings is not readable by the Python client).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

__all__ = [
    "content_dtype",
    "decode_tensor",
    "dtype_name",
    "encode_tensor",
    "shape_compatible",
    "shape_of_proto",
]

_INT_VAL = {
    types_pb2.DT_INT32,
    types_pb2.DT_INT16,
    types_pb2.DT_INT8,
    types_pb2.DT_UINT8,
    types_pb2.DT_UINT16,
}


def dtype_name(dtype: int) -> str:
    """TF's ``DataTypeString`` of a ``DataType`` enum value (``float``, ``double``, ``int64``, ...)."""
    if dtype in types_pb2.DataType.values():
        name: str = types_pb2.DataType.Name(dtype)
        return name.removeprefix("DT_").lower()
    return f"<unknown dtype {dtype}>"


def decode_tensor(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """The numpy value of ``proto``; raises ``ValueError``/``TypeError`` for an inconsistent proto, and
    ``ValueError`` for a shape of more than :data:`MAX_DECODED_ELEMENTS` elements.

    A numeric ``tensor_content`` holding exactly the shape's elements (what TF Serving clients and the gateway send)
    is read in place: a read-only view of the proto's bytes (one copy, the one protobuf makes handing them out),
    not ``tf.make_ndarray``'s second copy. Anything else goes through ``tf.make_ndarray``.
    """
    content = _content_view(proto)
    if content is not None:
        return content
    _check_elements(proto)
    try:
        value: np.ndarray = tf.make_ndarray(proto)
    except KeyError:  # TF has no numpy type for it (a reference dtype such as DT_RESOURCE_REF, 120)
        raise TypeError(f"cannot decode a tensor of dtype {dtype_name(proto.dtype)}") from None
    return value


# the most elements decoded from one tensor: a proto may carry fewer values than its shape has elements (they are
# padded with the last one), so a few bytes could otherwise ask for any amount of memory
MAX_DECODED_ELEMENTS = 1 << 31


def _check_elements(proto: tensor_pb2.TensorProto) -> None:
    """ValueError when ``proto``'s shape has more than :data:`MAX_DECODED_ELEMENTS` elements (negative dims and
    unknown rank are left to ``tf.make_ndarray``, which words them)."""
    if proto.tensor_shape.unknown_rank:
        return
    n = 1
    for d in proto.tensor_shape.dim:
        if d.size < 0:
            return
        n *= d.size
    if n > MAX_DECODED_ELEMENTS:
        dims = ", ".join(str(d.size) for d in proto.tensor_shape.dim)
        raise ValueError(
            f"tensor of shape [{dims}] has {n} elements, more than the {MAX_DECODED_ELEMENTS} decoded"
        )


def _content_view(proto: tensor_pb2.TensorProto) -> np.ndarray | None:
    """``proto``'s ``tensor_content`` as a read-only little-endian array of its shape, or None when the fast read
    does not apply (no content, a string/resource/variant dtype, unknown rank, or a byte count that is not the
    shape's)."""
    np_dtype = _NUMPY.get(proto.dtype)
    if np_dtype is None or proto.tensor_shape.unknown_rank:
        return None
    content = proto.tensor_content  # protobuf copies the field each time it is read: read it once
    if not content:
        return None
    shape = [int(d.size) for d in proto.tensor_shape.dim]
    if len(content) != math.prod(shape) * np_dtype.itemsize:
        return None
    return np.frombuffer(content, dtype=np_dtype).reshape(shape)


# DataType -> little-endian numpy dtype of the numeric types whose tensor_content is read in place
_NUMPY = {
    dt.as_datatype_enum: np.dtype(dt.as_numpy_dtype).newbyteorder("<")
    for dt in (
        tf.float32,
        tf.float64,
        tf.float16,
        tf.bfloat16,
        tf.int8,
        tf.int16,
        tf.int32,
        tf.int64,
        tf.uint8,
        tf.uint16,
        tf.uint32,
        tf.uint64,
        tf.bool,
        tf.complex64,
        tf.complex128,
    )
}


def content_dtype(dtype: int) -> np.dtype[Any] | None:
    """The little-endian numpy dtype in which a ``tensor_content`` of DataType ``dtype`` is read in place, or None
    for a dtype whose content is not (strings, resources, variants, unknown numbers)."""
    return _NUMPY.get(dtype)


def shape_of_proto(shape: tensor_shape_pb2.TensorShapeProto) -> list[int] | None:
    """Dims of a ``TensorShapeProto`` (-1 = unknown), or None for unknown rank."""
    if shape.unknown_rank:
        return None
    return [int(d.size) for d in shape.dim]


def shape_compatible(actual: tuple[int, ...], expected: list[int] | None) -> bool:
    if expected is None:
        return True
    if len(actual) != len(expected):
        return False
    return all(e < 0 or a == e for a, e in zip(actual, expected, strict=True))


def encode_tensor(value: np.ndarray, dtype: int, *, as_content: bool = False) -> tensor_pb2.TensorProto:
    """``value`` (already of the tensor's dtype ``dtype``) as a ``TensorProto``."""
    arr = np.asarray(value)
    proto = tensor_pb2.TensorProto(dtype=dtype)
    for size in arr.shape:
        proto.tensor_shape.dim.add(size=int(size))
    flat = arr.reshape(-1)
    if dtype == types_pb2.DT_STRING:
        proto.string_val.extend(_as_bytes(v) for v in flat)
        return proto
    if as_content:
        np_dtype = tf.dtypes.as_dtype(dtype).as_numpy_dtype
        proto.tensor_content = (
            np.ascontiguousarray(flat, dtype=np_dtype)
            .astype(np.dtype(np_dtype).newbyteorder("<"), copy=False)
            .tobytes()
        )
        return proto
    if dtype == types_pb2.DT_FLOAT:
        proto.float_val.extend(flat.astype(np.float32).tolist())
    elif dtype == types_pb2.DT_DOUBLE:
        proto.double_val.extend(flat.astype(np.float64).tolist())
    elif dtype in _INT_VAL:
        proto.int_val.extend(flat.astype(np.int64).tolist())
    elif dtype == types_pb2.DT_INT64:
        proto.int64_val.extend(flat.astype(np.int64).tolist())
    elif dtype == types_pb2.DT_UINT32:
        proto.uint32_val.extend(flat.astype(np.uint32).tolist())
    elif dtype == types_pb2.DT_UINT64:
        proto.uint64_val.extend(flat.astype(np.uint64).tolist())
    elif dtype == types_pb2.DT_BOOL:
        proto.bool_val.extend(flat.astype(bool).tolist())
    elif dtype in (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16):
        np_dtype = tf.dtypes.as_dtype(dtype).as_numpy_dtype
        proto.half_val.extend(flat.astype(np_dtype).view(np.uint16).astype(np.int32).tolist())
    elif dtype == types_pb2.DT_COMPLEX64:
        proto.scomplex_val.extend(flat.astype(np.complex64).view(np.float32).tolist())
    elif dtype == types_pb2.DT_COMPLEX128:
        proto.dcomplex_val.extend(flat.astype(np.complex128).view(np.float64).tolist())
    else:  # resource/variant etc.: no typed field; fall back to TF's own encoder
        proto.CopyFrom(tf.make_tensor_proto(arr))
    return proto


def _as_bytes(v: object) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    return str(v).encode("utf-8")
