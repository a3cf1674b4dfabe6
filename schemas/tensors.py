"""TensorProto <-> numpy, pure: the one codec of the gateway and the updater.

``to_ndarray`` decodes both encodings a TF Serving server may send: raw ``tensor_content`` (numpy ``frombuffer``,
no copy) and the typed ``*_val`` fields (a single value fills the tensor; fewer values repeat the last one, as
TensorFlow's ``Tensor::FromProto`` does). ``from_ndarray`` encodes numeric arrays as little-endian
``tensor_content`` (fast for large float tensors), strings (object/bytes/str arrays) as ``string_val`` (str as
UTF-8), and the 8/16-bit integer types as ``int_val`` with the values unchanged: TF Serving's JSON layer accepts any
int32 for DT_INT8/INT16/UINT8 and sends it as is (300 for a DT_INT8 input stays 300 in ``int_val``; the model
server narrows it when it builds the tensor), so a client must not narrow it first.

Errors are neutral (:class:`TensorError`, a ``ValueError``): each side maps them at its boundary (the gateway in
:mod:`gateway.codec.tensor`, the updater in :mod:`updater.apply`)::

    TensorError
     ├── UnsupportedDtype    a DataType or numpy dtype with no encoding here
     └── MalformedTensor     unknown rank, or a value count / byte size that does not fit the shape
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from schemas.proto import tfs_pb2

__all__ = [
    "NP_DTYPES",
    "MalformedTensor",
    "TensorError",
    "UnsupportedDtype",
    "dtype_for",
    "from_ndarray",
    "to_ndarray",
]


class TensorError(ValueError):
    """A tensor or array this codec cannot convert; the message says what was wrong."""


class UnsupportedDtype(TensorError):
    """The DataType (or numpy dtype) has no encoding in this codec; ``dtype`` names it (``DT_RESOURCE``,
    ``complex256``)."""

    def __init__(self, message: str, dtype: str) -> None:
        super().__init__(message)
        self.dtype = dtype


class MalformedTensor(TensorError):
    """The TensorProto contradicts itself: unknown rank, or values that do not fit its shape."""


DT = tfs_pb2.DataType

NP_DTYPES: dict[int, Any] = {
    DT.DT_FLOAT: np.dtype("<f4"),
    DT.DT_DOUBLE: np.dtype("<f8"),
    DT.DT_INT32: np.dtype("<i4"),
    DT.DT_UINT8: np.dtype("u1"),
    DT.DT_INT16: np.dtype("<i2"),
    DT.DT_INT8: np.dtype("i1"),
    DT.DT_INT64: np.dtype("<i8"),
    DT.DT_BOOL: np.dtype("?"),
    DT.DT_UINT16: np.dtype("<u2"),
    DT.DT_UINT32: np.dtype("<u4"),
    DT.DT_UINT64: np.dtype("<u8"),
    DT.DT_HALF: np.dtype("<f2"),
    DT.DT_COMPLEX64: np.dtype("<c8"),
    DT.DT_COMPLEX128: np.dtype("<c16"),
    DT.DT_STRING: np.dtype(object),
}
_BY_NP = {v.str if v != np.dtype(object) else "|O": k for k, v in NP_DTYPES.items()}

# typed field holding each dtype's values (when tensor_content is empty)
_FIELD = {
    DT.DT_FLOAT: "float_val",
    DT.DT_DOUBLE: "double_val",
    DT.DT_INT32: "int_val",
    DT.DT_UINT8: "int_val",
    DT.DT_INT16: "int_val",
    DT.DT_INT8: "int_val",
    DT.DT_UINT16: "int_val",
    DT.DT_INT64: "int64_val",
    DT.DT_BOOL: "bool_val",
    DT.DT_UINT32: "uint32_val",
    DT.DT_UINT64: "uint64_val",
    DT.DT_HALF: "half_val",
    DT.DT_COMPLEX64: "scomplex_val",
    DT.DT_COMPLEX128: "dcomplex_val",
    DT.DT_STRING: "string_val",
}


# carried in int_val as int32 values; the backend narrows them when it builds the tensor
_NARROW_INTS = frozenset({DT.DT_INT8, DT.DT_INT16, DT.DT_UINT8, DT.DT_UINT16})


def dtype_for(arr: np.ndarray) -> int:
    """The DataType of a numpy array (object/bytes/str arrays are DT_STRING)."""
    if arr.dtype.kind in "OSU":
        return DT.DT_STRING
    try:
        return _BY_NP[arr.dtype.newbyteorder("<").str if arr.dtype.byteorder == ">" else arr.dtype.str]
    except KeyError:
        raise UnsupportedDtype(
            f"numpy dtype {arr.dtype} has no TensorProto encoding", str(arr.dtype)
        ) from None


def to_ndarray(t: tfs_pb2.TensorProto) -> np.ndarray:
    """Decode a TensorProto (``tensor_content`` or typed fields). Strings come back as an object array of bytes."""
    if t.tensor_shape.unknown_rank:
        raise MalformedTensor("tensor of unknown rank")
    shape = [d.size for d in t.tensor_shape.dim]
    n = math.prod(shape)
    dtype = NP_DTYPES.get(t.dtype)
    if dtype is None:
        name = DT.Name(t.dtype) if t.dtype in DT.values() else str(t.dtype)
        raise UnsupportedDtype(f"tensor type {name.removeprefix('DT_').lower()} has no numpy decoding", name)
    if t.dtype == DT.DT_STRING:
        vals: np.ndarray = np.empty(len(t.string_val), dtype=object)
        vals[:] = list(t.string_val)
    elif t.tensor_content:
        if len(t.tensor_content) != n * dtype.itemsize:
            raise MalformedTensor(
                f"tensor_content has {len(t.tensor_content)} bytes, shape {shape} of {dtype} needs {n * dtype.itemsize}"
            )
        return np.frombuffer(t.tensor_content, dtype=dtype).reshape(shape)
    else:
        raw = getattr(t, _FIELD[t.dtype])
        if t.dtype == DT.DT_HALF:
            vals = np.array(raw, dtype=np.uint16).view(np.float16)
        elif t.dtype in (DT.DT_COMPLEX64, DT.DT_COMPLEX128):
            parts: npt.NDArray[np.floating[Any]] = np.array(
                raw, dtype=np.float32 if t.dtype == DT.DT_COMPLEX64 else np.float64
            )
            vals = parts[0::2] + 1j * parts[1::2]
            vals = vals.astype(dtype)
        elif t.dtype in _NARROW_INTS:
            vals = np.array(raw, dtype=np.int64).astype(dtype)  # wrap like TensorFlow's cast from int_val
        else:
            vals = np.array(raw, dtype=dtype)
    count = len(vals)
    if count == n:
        return vals.reshape(shape)
    if count == 0:
        out = np.zeros(n, dtype=dtype) if t.dtype != DT.DT_STRING else np.full(n, b"", dtype=object)
        return out.reshape(shape)
    if count < n:
        return np.concatenate([vals, np.repeat(vals[-1:], n - count)]).reshape(shape)
    raise MalformedTensor(f"tensor has {count} values but shape {shape} holds {n}")


def from_ndarray(arr: Any, dtype: int | None = None) -> tfs_pb2.TensorProto:
    """Encode an array; ``dtype`` (a DataType) overrides the one implied by the array."""
    a = np.asarray(arr)
    dt = dtype if dtype is not None else dtype_for(a)
    # DataType values are plain ints at runtime; protoc's stub types the field as its enum class.
    t = tfs_pb2.TensorProto(dtype=cast(tfs_pb2.DataType, dt))
    for d in a.shape:
        t.tensor_shape.dim.add().size = int(d)
    if dt == DT.DT_STRING:
        t.string_val.extend(x if isinstance(x, bytes) else str(x).encode() for x in a.ravel().tolist())
        return t
    if dt in _NARROW_INTS:
        # values as given (int32 range checked by the JSON codec), never wrapped to the narrow type
        t.int_val.extend(np.asarray(a, dtype=np.int64).ravel().tolist())
        return t
    np_dtype = NP_DTYPES.get(dt)
    if np_dtype is None:
        name = DT.Name(dt) if dt in DT.values() else str(dt)
        raise UnsupportedDtype(f"cannot encode tensor type {name} from numpy", name)
    t.tensor_content = np.ascontiguousarray(a, dtype=np_dtype).tobytes()
    return t
