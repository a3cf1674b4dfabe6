"""tensors.py: TF Serving's two output encodings round-trip through tf.make_ndarray for every plain dtype."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from embedgate.localserve.tensors import decode_tensor, dtype_name, encode_tensor, shape_compatible

DTYPES = [
    tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64,
    tf.bool, tf.float16, tf.bfloat16, tf.complex64, tf.complex128,
]  # fmt: skip


@pytest.mark.parametrize("as_content", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_round_trip(dtype: tf.DType, as_content: bool) -> None:
    value = np.array([[0, 1, 2], [3, 4, 5]]).astype(dtype.as_numpy_dtype)
    proto = encode_tensor(value, dtype.as_datatype_enum, as_content=as_content)
    assert bool(proto.tensor_content) == as_content
    assert [d.size for d in proto.tensor_shape.dim] == [2, 3]
    back = decode_tensor(proto)
    assert back.dtype == value.dtype
    np.testing.assert_array_equal(back, value)


@pytest.mark.parametrize("as_content", [False, True])
def test_strings_always_use_string_val(as_content: bool) -> None:
    value = np.array([b"a", "b\u00e9".encode()], dtype=object)
    proto = encode_tensor(value, tf.string.as_datatype_enum, as_content=as_content)
    assert list(proto.string_val) == [b"a", "b\u00e9".encode()] and not proto.tensor_content


def test_typed_float_val_matches_tf_serving_default() -> None:
    proto = encode_tensor(np.array([1.5, 2.0], np.float32), tf.float32.as_datatype_enum)
    assert list(proto.float_val) == [1.5, 2.0]


def test_names_and_shapes() -> None:
    assert [dtype_name(d.as_datatype_enum) for d in (tf.float32, tf.float64, tf.int64, tf.string)] == [
        "float", "double", "int64", "string",
    ]  # fmt: skip
    assert shape_compatible((2, 3), [-1, 3]) and shape_compatible((2,), None)
    assert not shape_compatible((2,), [-1, 1]) and not shape_compatible((2, 4), [-1, 3])


def test_a_dtype_numpy_cannot_hold_is_a_type_error() -> None:
    """A reference dtype (DT_RESOURCE_REF, 120) has no numpy type: TypeError naming it, as for other bad protos."""
    proto = tensor_pb2.TensorProto(dtype=120)
    proto.tensor_shape.dim.add(size=1)
    with pytest.raises(TypeError, match="cannot decode a tensor of dtype resource_ref"):
        decode_tensor(proto)


def test_a_shape_too_large_to_decode_is_a_value_error() -> None:
    """Two bool values for 2^63 - 2 elements would be padded to 8 EiB (found by the request decoder's hypothesis test
    in CI): ValueError naming the shape, before any allocation. Padding within the bound still works."""
    from embedgate.localserve.tensors import MAX_DECODED_ELEMENTS

    proto = tensor_pb2.TensorProto(dtype=tf.bool.as_datatype_enum, bool_val=[False, False])
    proto.tensor_shape.dim.add(size=2**63 - 2)
    with pytest.raises(ValueError, match=r"shape \[9223372036854775806\] has 9223372036854775806 elements"):
        decode_tensor(proto)
    proto.tensor_shape.dim[0].size = MAX_DECODED_ELEMENTS + 1
    with pytest.raises(ValueError, match="more than the 2147483648 decoded"):
        decode_tensor(proto)
    proto.tensor_shape.dim[0].size = 5
    np.testing.assert_array_equal(decode_tensor(proto), np.zeros(5, dtype=bool))
