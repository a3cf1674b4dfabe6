"""gateway.codec.numeric: the fast path gives exactly what to_ndarray gives, or declines (None)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec.numeric import numeric_ndarray
from gateway.codec.tensor import to_ndarray
from schemas.proto import tfs_pb2

DT = tfs_pb2.DataType
_FIELDS = {
    DT.DT_INT64: ("int64_val", np.int64),
    DT.DT_INT32: ("int_val", np.int32),
    DT.DT_FLOAT: ("float_val", np.float32),
    DT.DT_DOUBLE: ("double_val", np.float64),
    DT.DT_INT16: ("int_val", np.int16),  # declined: narrow ints keep to_ndarray's wrapping rules
    DT.DT_BOOL: ("bool_val", np.bool_),  # declined: not a hot-path dtype
}


@st.composite
def _tensors(draw: st.DrawFn) -> tfs_pb2.TensorProto:
    dtype = draw(st.sampled_from(sorted(_FIELDS)))
    field, np_dtype = _FIELDS[dtype]
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    n = int(np.prod(shape)) if shape else 1
    values = np.arange(1, n + 1).astype(np_dtype)
    t = tfs_pb2.TensorProto(dtype=dtype)
    for d in shape:
        t.tensor_shape.dim.add(size=d)
    how = draw(st.sampled_from(["content", "typed", "fewer", "bad_content"]))
    if how == "content":
        t.tensor_content = values.tobytes()
    elif how == "bad_content" and n:
        t.tensor_content = values.tobytes()[:-1]
    elif how == "typed":
        getattr(t, field).extend(values.tolist())
    elif how == "fewer" and n > 1:  # TensorFlow repeats the last value
        getattr(t, field).extend(values[: draw(st.integers(1, n - 1))].tolist())
    return t


@settings(max_examples=300, deadline=None)
@given(_tensors())
def test_same_as_to_ndarray_or_declined(t: tfs_pb2.TensorProto) -> None:
    fast = numeric_ndarray(t)
    if fast is None:
        return
    assert t.dtype in (DT.DT_INT64, DT.DT_INT32, DT.DT_FLOAT, DT.DT_DOUBLE)
    slow = to_ndarray(t)
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    np.testing.assert_array_equal(fast, slow)


def test_common_cases_take_the_fast_path() -> None:
    t = tfs_pb2.TensorProto(dtype=DT.DT_INT64)
    t.tensor_shape.dim.add(size=1)
    t.int64_val.append(7)  # what tf.make_tensor_proto sends for one id
    assert numeric_ndarray(t) is not None and numeric_ndarray(t).tolist() == [7]  # type: ignore[union-attr]
    c = tfs_pb2.TensorProto(dtype=DT.DT_FLOAT, tensor_content=np.ones((2, 3), np.float32).tobytes())
    c.tensor_shape.dim.add(size=2)
    c.tensor_shape.dim.add(size=3)
    assert numeric_ndarray(c).shape == (2, 3)  # type: ignore[union-attr]
    unknown = tfs_pb2.TensorProto(dtype=DT.DT_FLOAT)
    unknown.tensor_shape.unknown_rank = True
    assert numeric_ndarray(unknown) is None


def test_many_typed_values() -> None:
    t = tfs_pb2.TensorProto(dtype=DT.DT_FLOAT)
    t.tensor_shape.dim.add(size=1000)
    t.float_val.extend(np.linspace(-1, 1, 1000, dtype=np.float32).tolist())
    fast = numeric_ndarray(t)
    assert fast is not None
    np.testing.assert_array_equal(fast, to_ndarray(t))
    assert fast.dtype == np.float32
