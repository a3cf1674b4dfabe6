"""tensors.decode_tensor's in-place read of tensor_content: equal to tf.make_ndarray, read-only, and inconsistent
protos still decoded (or refused) by tf.make_ndarray itself."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from embedgate.localserve.tensors import decode_tensor


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16, tf.int32, tf.int64, tf.uint8])
def test_content_is_read_in_place_and_equals_make_ndarray(dtype: tf.DType) -> None:
    value = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype.as_numpy_dtype)
    proto = tf.make_tensor_proto(value)
    assert proto.tensor_content  # make_tensor_proto packs numeric arrays as content
    got = decode_tensor(proto)
    assert got.dtype == value.dtype and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, tf.make_ndarray(proto))
    assert not got.flags.writeable  # a view of the request's bytes: never written


def test_a_byte_count_that_is_not_the_shapes_goes_to_make_ndarray() -> None:
    proto = tf.make_tensor_proto(np.arange(6, dtype=np.float32).reshape(2, 3))
    proto.tensor_content = proto.tensor_content[:-4]  # 5 floats for a [2, 3] tensor
    with pytest.raises((ValueError, TypeError)):
        tf.make_ndarray(proto)
    with pytest.raises((ValueError, TypeError)):
        decode_tensor(proto)


def test_an_empty_tensor() -> None:
    proto = tf.make_tensor_proto(np.zeros((0, 4), np.float32))
    assert decode_tensor(proto).shape == (0, 4)
