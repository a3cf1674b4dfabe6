"""Predict / GetModelMetadata through the official tensorflow-serving-api stubs against serve-local."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _request(
    model: str,
    inputs: dict[str, np.ndarray],
    *,
    signature: str = "",
    version: int | None = None,
    label: str = "",
    output_filter: tuple[str, ...] = (),
) -> predict_pb2.PredictRequest:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    req.model_spec.signature_name = signature
    if version is not None:
        req.model_spec.version.value = version
    if label:
        req.model_spec.version_label = label
    for k, v in inputs.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))  # numpy -> tensor_content encoding
    req.output_filter.extend(output_filter)
    return req


def _x(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array(values, np.float32)}


def test_predict_latest_typed_outputs(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    resp = stub.Predict(_request("half", _x(1, 2, 3)), 10)
    assert resp.model_spec.name == "half"
    assert resp.model_spec.version.value == 2
    assert resp.model_spec.signature_name == "serving_default"
    y = resp.outputs["y"]
    assert y.dtype == types_pb2.DT_FLOAT and not y.tensor_content  # typed *_val by default, as TF Serving
    assert list(y.float_val) == [2.5, 3.0, 3.5]
    assert [d.size for d in y.tensor_shape.dim] == [3]
    np.testing.assert_allclose(tf.make_ndarray(resp.outputs["x2"]), [2, 4, 6])


def test_calls_without_a_deadline_are_served(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    # no timeout: gRPC reports ~2**63 s left, which must not reach TF's millisecond session timeout (was INTERNAL)
    assert list(stub.Predict(_request("half", _x(1, 2))).outputs["y"].float_val) == [2.5, 3.0]


def test_predict_typed_inputs(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "half"
    x = req.inputs["x"]
    x.dtype = types_pb2.DT_FLOAT
    x.tensor_shape.dim.add(size=2)
    x.float_val.extend([4.0, 6.0])
    resp = stub.Predict(req, 10)
    assert list(resp.outputs["y"].float_val) == [4.0, 5.0]


def test_specific_version_label_and_policy(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    assert list(stub.Predict(_request("half", _x(2), version=1), 10).outputs["y"].float_val) == [2.0]
    stable = stub.Predict(_request("half", _x(2), label="stable"), 10)
    assert stable.model_spec.version.value == 1 and list(stable.outputs["y"].float_val) == [2.0]
    assert stub.Predict(_request("half", _x(2), label="canary"), 10).model_spec.version.value == 2
    pinned = stub.Predict(_request("half_pinned", _x(2)), 10)  # specific { versions: 1 } though 2 exists
    assert pinned.model_spec.version.value == 1


def test_other_signature_and_output_filter(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    resp = stub.Predict(
        _request("half", {"x": np.array([[1.0], [2.0]], np.float32)}, signature="times_ten"), 10
    )
    assert resp.model_spec.signature_name == "times_ten"
    assert tf.make_ndarray(resp.outputs["z"]).tolist() == [[10.0], [20.0]]
    only_y = stub.Predict(_request("half", _x(1), output_filter=("y",)), 10)
    assert list(only_y.outputs) == ["y"]


def test_large_messages(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    x = np.arange(2_000_000, dtype=np.float32)  # 8 MB each way: above gRPC's 4 MiB default
    resp = stub.Predict(_request("half", {"x": x}, output_filter=("x2",)), 30)
    np.testing.assert_array_equal(tf.make_ndarray(resp.outputs["x2"])[-3:], 2 * x[-3:])


def test_state_persists_across_requests(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    ins = stub.Predict(
        _request(
            "store",
            {"keys": np.array([7, 8], np.int64), "values": np.array([0.5, 1.5], np.float32)},
            signature="insert",
        ),
        10,
    )
    assert ins.outputs["size"].dtype == types_pb2.DT_INT64
    assert tf.make_ndarray(ins.outputs["size"]) >= 2
    out = stub.Predict(_request("store", {"keys": np.array([8, 7, 12345], np.int64)}, signature="lookup"), 10)
    assert list(out.outputs["values"].float_val) == [1.5, 0.5, -1.0]


def _code(
    stub: prediction_service_pb2_grpc.PredictionServiceStub, req: predict_pb2.PredictRequest
) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(req, 10)
    err = info.value
    return err.code(), err.details()  # type: ignore[attr-defined]


def test_predict_errors(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    nf, inv, fp = (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert _code(stub, _request("nope", _x(1))) == (nf, "Servable not found for request: Latest(nope)")
    assert _code(stub, _request("half", _x(1), version=9)) == (
        nf,
        "Servable not found for request: Specific(half, 9)",
    )
    assert _code(stub, _request("half_pinned", _x(1), version=2)) == (
        nf,
        "Servable not found for request: Specific(half_pinned, 2)",
    )
    assert _code(stub, _request("half", _x(1), label="beta")) == (
        inv,
        "Unrecognized servable version label: beta",
    )
    assert _code(stub, _request("half", _x(1), signature="nope")) == (
        fp,
        'Serving signature key "nope" not found.',
    )
    assert _code(stub, _request("half", {})) == (
        inv,
        "input size does not match signature: 0!=1 len({}) != len({x}). Sent extra: {}. Missing but required: {x}.",
    )
    code, msg = _code(stub, _request("half", {"x": np.ones(1, np.float32), "w": np.ones(1, np.float32)}))
    assert code == inv and "Sent extra: {w}" in msg
    code, msg = _code(stub, _request("half", {"w": np.ones(1, np.float32)}))
    assert code == inv and msg.startswith("input tensor alias not found in signature: w.")
    code, msg = _code(stub, _request("half", {"x": np.ones(2, np.int64)}))
    assert code == inv and "Expects arg[0] to be float but int64 is provided" in msg
    code, msg = _code(stub, _request("half", {"x": np.ones(2, np.float32)}, signature="times_ten"))
    assert code == inv and "shape [2]" in msg
    code, msg = _code(stub, _request("half", _x(1), output_filter=("nope",)))
    assert (
        code == inv
        and msg
        == "output tensor alias not found in signature: nope Outputs expected to be in the set {x2,y}."
    )
    assert _code(stub, _request("half", _x(1), output_filter=("y", "y"))) == (
        inv,
        "duplicate output tensor alias: y",
    )
    bad = _request("half", {})
    bad.inputs["x"].dtype = types_pb2.DT_FLOAT
    bad.inputs["x"].tensor_shape.dim.add(size=2)
    bad.inputs["x"].tensor_content = b"\x00" * 3  # not a multiple of 4 bytes
    code, msg = _code(stub, bad)
    assert code == inv and "x" in msg


def test_metadata(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    req = get_model_metadata_pb2.GetModelMetadataRequest()
    req.model_spec.name = "half"
    req.metadata_field.append("signature_def")
    resp = stub.GetModelMetadata(req, 10)
    assert resp.model_spec.name == "half" and resp.model_spec.version.value == 2
    assert resp.metadata["signature_def"].type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    sigs = get_model_metadata_pb2.SignatureDefMap()
    resp.metadata["signature_def"].Unpack(sigs)
    sig = sigs.signature_def["serving_default"]
    assert sig.method_name == "tensorflow/serving/predict"
    assert sig.inputs["x"].dtype == types_pb2.DT_FLOAT
    assert [d.size for d in sig.inputs["x"].tensor_shape.dim] == [-1]
    assert set(sig.outputs) == {"y", "x2"}
    assert "times_ten" in sigs.signature_def
    req.model_spec.version.value = 1
    assert stub.GetModelMetadata(req, 10).model_spec.version.value == 1

    empty = get_model_metadata_pb2.GetModelMetadataRequest()
    empty.model_spec.name = "half"
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelMetadata(empty, 10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert info.value.details() == "GetModelMetadataRequest must specify at least one metadata_field"  # type: ignore[attr-defined]
    empty.metadata_field.append("bogus")
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelMetadata(empty, 10)
    assert info.value.details() == "Metadata field bogus is not supported"  # type: ignore[attr-defined]
    empty.model_spec.name = "nope"
    empty.metadata_field[:] = ["signature_def"]
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelMetadata(empty, 10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_wire_compatible_with_our_tfs_protos(channel: grpc.Channel) -> None:
    """The gateway's own copy of the messages (schemas.proto.tfs_pb2), called by method path, as the gateway does."""
    from schemas.proto import tfs_pb2

    predict = channel.unary_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=tfs_pb2.PredictRequest.SerializeToString,
        response_deserializer=tfs_pb2.PredictResponse.FromString,
    )
    req = tfs_pb2.PredictRequest()
    req.model_spec.name = "half"
    req.model_spec.version.value = 1
    x = req.inputs["x"]
    x.dtype = types_pb2.DT_FLOAT
    x.tensor_shape.dim.add(size=2)
    x.float_val.extend([2.0, 4.0])
    resp = predict(req, timeout=10)
    assert resp.model_spec.version.value == 1
    assert list(resp.outputs["y"].float_val) == [2.0, 3.0]

    metadata = channel.unary_unary(
        "/tensorflow.serving.PredictionService/GetModelMetadata",
        request_serializer=tfs_pb2.GetModelMetadataRequest.SerializeToString,
        response_deserializer=tfs_pb2.GetModelMetadataResponse.FromString,
    )
    mreq = tfs_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    mreq.model_spec.name = "half"
    packed = metadata(mreq, timeout=10).metadata["signature_def"]
    assert packed.type_url.endswith("tensorflow.serving.SignatureDefMap")
    sigs = tfs_pb2.SignatureDefMap.FromString(packed.value)
    assert set(sigs.signature_def["serving_default"].outputs) == {"y", "x2"}
