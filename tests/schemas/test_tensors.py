"""schemas.tensors, the shared TensorProto <-> numpy codec: both tensor_content and typed *_val fields."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from schemas.proto import tfs_pb2
from schemas.tensors import NP_DTYPES, MalformedTensor, UnsupportedDtype, from_ndarray, to_ndarray

DT = tfs_pb2.DataType


def typed(dtype: int, shape: list[int], field: str, values: list[object]) -> tfs_pb2.TensorProto:
    t = tfs_pb2.TensorProto(dtype=dtype)
    for d in shape:
        t.tensor_shape.dim.add().size = d
    getattr(t, field).extend(values)
    return t


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from(
            [
                np.float32,
                np.float64,
                np.int32,
                np.int64,
                np.uint8,
                np.bool_,
                np.int8,
                np.uint32,
                np.uint64,
                np.float16,
            ]
        ),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    )
)
def test_tensor_content_round_trip(arr: np.ndarray) -> None:
    back = to_ndarray(from_ndarray(arr))
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


def test_typed_fields() -> None:
    assert to_ndarray(typed(DT.DT_FLOAT, [2, 2], "float_val", [1, 2, 3, 4])).tolist() == [[1, 2], [3, 4]]
    assert to_ndarray(typed(DT.DT_INT64, [3], "int64_val", [7])).tolist() == [7, 7, 7]  # one value fills
    assert to_ndarray(typed(DT.DT_INT32, [3], "int_val", [1, 2])).tolist() == [1, 2, 2]  # last repeats
    assert to_ndarray(typed(DT.DT_DOUBLE, [2], "double_val", [])).tolist() == [0.0, 0.0]
    assert to_ndarray(typed(DT.DT_BOOL, [2], "bool_val", [True, False])).tolist() == [True, False]
    assert to_ndarray(typed(DT.DT_STRING, [2], "string_val", [b"a", b"b"])).tolist() == [b"a", b"b"]
    assert to_ndarray(typed(DT.DT_UINT64, [1], "uint64_val", [2**64 - 1])).tolist() == [2**64 - 1]
    half = np.array([1.5, -2.0], dtype=np.float16)
    assert to_ndarray(typed(DT.DT_HALF, [2], "half_val", half.view(np.uint16).tolist())).tolist() == [
        1.5,
        -2.0,
    ]
    assert to_ndarray(typed(DT.DT_FLOAT, [], "float_val", [3.0])).shape == ()


def test_strings_and_errors() -> None:
    t = from_ndarray(np.array([b"x", "y"], dtype=object))
    assert t.dtype == DT.DT_STRING and list(t.string_val) == [b"x", b"y"]
    with pytest.raises(UnsupportedDtype, match="resource") as info:
        to_ndarray(tfs_pb2.TensorProto(dtype=DT.DT_RESOURCE))
    assert info.value.dtype == "DT_RESOURCE"
    with pytest.raises(UnsupportedDtype, match="float128|longdouble"):
        from_ndarray(np.zeros(1, np.longdouble))


def test_malformed_tensors_name_what_does_not_fit() -> None:
    t = from_ndarray(np.zeros(3, np.float32))
    t.tensor_content = t.tensor_content[:-1]
    with pytest.raises(MalformedTensor, match="11 bytes"):
        to_ndarray(t)
    over = tfs_pb2.TensorProto(dtype=DT.DT_INT64, int64_val=[1, 2, 3])
    over.tensor_shape.dim.add().size = 2
    with pytest.raises(MalformedTensor, match="3 values but shape"):
        to_ndarray(over)
    unknown = tfs_pb2.TensorProto(dtype=DT.DT_FLOAT)
    unknown.tensor_shape.unknown_rank = True
    with pytest.raises(MalformedTensor, match="unknown rank"):
        to_ndarray(unknown)


def test_updater_write_encodings_are_little_endian_tensor_content() -> None:
    ids = from_ndarray(np.array([1, 2**40], np.int64))
    assert ids.dtype == DT.DT_INT64 and ids.tensor_content == np.array([1, 2**40], "<i8").tobytes()
    rows = from_ndarray(np.ones((2, 3), np.float32))
    assert rows.dtype == DT.DT_FLOAT and [d.size for d in rows.tensor_shape.dim] == [2, 3]
    keys = from_ndarray(np.array(["t:0", "t:1"], dtype=object))
    assert keys.dtype == DT.DT_STRING and list(keys.string_val) == [b"t:0", b"t:1"]
    empty = from_ndarray(np.array([], dtype=object))
    assert empty.dtype == DT.DT_STRING and [d.size for d in empty.tensor_shape.dim] == [0]


@pytest.mark.parametrize("dtype", [DT.DT_INT8, DT.DT_INT16, DT.DT_UINT8])
def test_narrow_ints_travel_unnarrowed_in_int_val(dtype: int) -> None:
    # TF Serving's JSON layer accepts any int32 here and sends it as is; the model server narrows it
    t = from_ndarray(np.array([[300, -5]], np.int32), dtype)
    assert list(t.int_val) == [300, -5]
    assert not t.tensor_content
    assert [d.size for d in t.tensor_shape.dim] == [1, 2]
    wrapped = to_ndarray(t)  # decoding wraps like TensorFlow's cast instead of failing
    assert wrapped.dtype == NP_DTYPES[dtype]
    assert wrapped.tolist() == np.array([[300, -5]]).astype(NP_DTYPES[dtype]).tolist()
