"""A fast path of :func:`gateway.codec.tensor.to_ndarray` for the numeric tensors of the embedding hot path. Pure.

Ids, feature values, PS rows and entry outputs are int64/int32/float32/float64 tensors that hold one value per
element (``tensor_content``, or the typed ``*_val`` field). For those, :func:`numeric_ndarray` returns exactly what
``to_ndarray`` returns, without its fixed per-call cost (which dominates at small batches); for anything else
(other dtypes, a repeated last value, a byte count that does not match, unknown rank) it returns None and the caller
uses ``to_ndarray``, which also words the errors.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from schemas.proto import tfs_pb2

__all__ = ["numeric_ndarray"]

_SMALL: Final = 256

_FAST: Final[dict[int, tuple[np.dtype[Any], str]]] = {
    tfs_pb2.DataType.DT_INT64: (np.dtype("<i8"), "int64_val"),
    tfs_pb2.DataType.DT_INT32: (np.dtype("<i4"), "int_val"),
    tfs_pb2.DataType.DT_FLOAT: (np.dtype("<f4"), "float_val"),
    tfs_pb2.DataType.DT_DOUBLE: (np.dtype("<f8"), "double_val"),
}


def numeric_ndarray(t: tfs_pb2.TensorProto) -> np.ndarray | None:
    """``to_ndarray(t)`` when ``t`` is a plain numeric tensor with one value per element, else None."""
    fast = _FAST.get(t.dtype)
    if fast is None or t.tensor_shape.unknown_rank:
        return None
    dtype, field = fast
    shape = [d.size for d in t.tensor_shape.dim]
    n = 1
    for d in shape:
        n *= d
    content = t.tensor_content
    if content:
        if len(content) == n * dtype.itemsize:
            return np.frombuffer(content, dtype=dtype).reshape(shape)
        return None
    vals = getattr(t, field)
    if n and len(vals) == n:
        if n <= _SMALL:  # fromiter is the faster copy of a few values, np.array of many
            return np.fromiter(vals, dtype=dtype, count=n).reshape(shape)
        return np.array(vals, dtype=dtype).reshape(shape)
    return None
