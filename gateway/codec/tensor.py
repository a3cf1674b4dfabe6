"""The gateway's side of the shared TensorProto <-> numpy codec (:mod:`schemas.tensors`): the same functions, with the
codec's neutral errors mapped to the gateway's tree. A tensor a backend sent that cannot be read is ``Internal``
(malformed) or ``Unimplemented`` (a type with no JSON form, worded as TF Serving's REST layer words it); callers
reading client tensors turn these into ``InvalidArgument`` themselves."""

from __future__ import annotations

from typing import Any

import numpy as np

from gateway.errors import Internal, Unimplemented
from schemas import tensors
from schemas.proto import tfs_pb2
from schemas.tensors import NP_DTYPES

__all__ = ["NP_DTYPES", "dtype_for", "from_ndarray", "to_ndarray"]


def dtype_for(arr: np.ndarray) -> int:
    """:func:`schemas.tensors.dtype_for`; ``Unimplemented`` for a dtype without an encoding."""
    try:
        return tensors.dtype_for(arr)
    except tensors.UnsupportedDtype as exc:
        raise Unimplemented(str(exc)) from None


def to_ndarray(t: tfs_pb2.TensorProto) -> np.ndarray:
    """:func:`schemas.tensors.to_ndarray`; ``Unimplemented`` for a type without a numpy form, else ``Internal``."""
    try:
        return tensors.to_ndarray(t)
    except tensors.UnsupportedDtype as exc:
        name = exc.dtype.removeprefix("DT_").lower()
        raise Unimplemented(f"Failed to write JSON value for tensor type: {name}") from None
    except tensors.TensorError as exc:
        raise Internal(str(exc)) from None


def from_ndarray(arr: Any, dtype: int | None = None) -> tfs_pb2.TensorProto:
    """:func:`schemas.tensors.from_ndarray`; ``Unimplemented`` for a dtype without an encoding."""
    try:
        return tensors.from_ndarray(arr, dtype)
    except tensors.UnsupportedDtype as exc:
        raise Unimplemented(str(exc)) from None
