"""gateway.codec.tensor: the shared codec (schemas.tensors) with its errors mapped to the gateway's tree."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.codec.tensor import from_ndarray, to_ndarray
from gateway.errors import Internal, Unimplemented
from schemas.proto import tfs_pb2

DT = tfs_pb2.DataType


def test_a_type_without_a_json_form_is_unimplemented_in_tf_serving_words() -> None:
    with pytest.raises(Unimplemented, match="Failed to write JSON value for tensor type: resource"):
        to_ndarray(tfs_pb2.TensorProto(dtype=DT.DT_RESOURCE))
    with pytest.raises(Unimplemented, match="no TensorProto encoding"):
        from_ndarray(np.zeros(1, np.longdouble))


def test_a_malformed_tensor_is_internal() -> None:
    t = from_ndarray(np.zeros(3, np.float32))
    t.tensor_content = t.tensor_content[:-1]
    with pytest.raises(Internal, match="11 bytes"):
        to_ndarray(t)


def test_json_int8_request_keeps_300() -> None:
    from gateway.codec import json_tensor as jt

    tensors, _ = jt.tensors_from_request(jt.loads(b'{"instances": [300, -129]}'), {"x": DT.DT_INT8})
    assert list(from_ndarray(tensors["x"], DT.DT_INT8).int_val) == [300, -129]
