"""Classify / Regress with tf.Example input through the official stubs."""

from __future__ import annotations

import grpc
import pytest
from tensorflow.core.example import example_pb2
from tensorflow_serving.apis import classification_pb2, prediction_service_pb2_grpc, regression_pb2

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _example(x: float | None = None) -> example_pb2.Example:
    ex = example_pb2.Example()
    if x is not None:
        ex.features.feature["x"].float_list.value.append(x)
    return ex


def test_classify(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    req = classification_pb2.ClassificationRequest()
    req.model_spec.name = "clf"
    req.input.example_list.examples.extend([_example(0.0), _example(2.0)])
    resp = stub.Classify(req, 10)
    assert resp.model_spec.name == "clf" and resp.model_spec.version.value == 1
    assert resp.model_spec.signature_name == "serving_default"
    first, second = resp.result.classifications
    assert [c.label for c in first.classes] == ["neg", "pos"]
    assert [c.score for c in first.classes] == pytest.approx([0.5, 0.5])
    assert second.classes[1].score == pytest.approx(0.8807970)


def test_regress_with_context(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    req = regression_pb2.RegressionRequest()
    req.model_spec.name = "clf"
    req.model_spec.signature_name = "regress"
    ctx = req.input.example_list_with_context
    ctx.context.CopyFrom(_example(1.0))
    ctx.examples.extend([_example(), _example(2.0)])  # the first takes x from the context
    resp = stub.Regress(req, 10)
    assert resp.model_spec.signature_name == "regress"
    assert [r.value for r in resp.result.regressions] == pytest.approx([3.0, 6.0])


def _error(call: object, req: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(req, 10)  # type: ignore[operator]
    return info.value.code(), info.value.details()  # type: ignore[attr-defined]


def test_errors(stub: prediction_service_pb2_grpc.PredictionServiceStub) -> None:
    inv = grpc.StatusCode.INVALID_ARGUMENT
    req = classification_pb2.ClassificationRequest()
    req.model_spec.name = "clf"
    assert _error(stub.Classify, req) == (inv, "Input is empty.")
    req.input.example_list.examples.append(_example(1.0))
    req.model_spec.signature_name = "regress"
    code, msg = _error(stub.Classify, req)
    assert code == inv and msg.startswith(
        "Expected classification signature method_name to be "
        "tensorflow/serving/classify. Was: tensorflow/serving/regress"
    )
    req.model_spec.signature_name = "missing"
    assert _error(stub.Classify, req) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        'Serving signature key "missing" not found.',
    )
    req.model_spec.signature_name = ""
    req.model_spec.name = "nope"
    assert _error(stub.Classify, req) == (
        grpc.StatusCode.NOT_FOUND,
        "Servable not found for request: Latest(nope)",
    )
    reg = regression_pb2.RegressionRequest()
    reg.model_spec.name = "clf"  # serving_default is a classification signature
    reg.input.example_list.examples.append(_example(1.0))
    code, msg = _error(stub.Regress, reg)
    assert code == inv and "Expected regression signature method_name" in msg
    reg.model_spec.signature_name = "regress"
    reg.input.example_list.examples[0].features.feature["x"].float_list.value.append(2.0)  # 2 values, needs 1
    code, _ = _error(stub.Regress, reg)
    assert code == inv  # from parse_example, as TF reports it
