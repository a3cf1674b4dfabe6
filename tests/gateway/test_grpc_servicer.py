"""gateway.grpc_front.servicer pure parts: status codes, version specs, output_filter."""

from __future__ import annotations

import grpc
import pytest

from gateway.core import VersionSpec
from gateway.errors import Code, InvalidArgument
from gateway.grpc_front.servicer import _STATUS, _filtered, _version_spec
from schemas.proto import tfs_pb2


@pytest.mark.parametrize("code", list(Code))
def test_every_gateway_code_is_the_same_grpc_code(code: Code) -> None:
    assert _STATUS[int(code)] is grpc.StatusCode[code.name]


def test_version_spec_from_model_spec() -> None:
    assert _version_spec(tfs_pb2.ModelSpec(name="m")) == VersionSpec()
    v = tfs_pb2.ModelSpec(name="m")
    v.version.value = 0  # set, even though 0: TF Serving treats a present wrapper as a specific version
    assert _version_spec(v) == VersionSpec(version=0)
    assert _version_spec(tfs_pb2.ModelSpec(name="m", version_label="stable")) == VersionSpec(label="stable")


def test_output_filter() -> None:
    outputs = {"a": tfs_pb2.TensorProto(), "b": tfs_pb2.TensorProto()}
    assert _filtered(outputs, []) is outputs
    assert list(_filtered(outputs, ["b"])) == ["b"]
    with pytest.raises(InvalidArgument, match=r"output tensor alias not found in signature: c .*\{a,b\}"):
        _filtered(outputs, ["c"])
