"""Pass-through Predict over gRPC forwards the client's serialized request and relays the backend's serialized
answer, each with a ModelSpec appended. What a backend and a client read from those bytes is checked here with the
official ``tensorflow-serving-api`` messages (what TF Serving and its clients parse with)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from gateway.codec.tensor import from_ndarray
from gateway.core.metadata import MetadataCache
from gateway.core.passthrough import PassthroughServable
from gateway.core.requests import VersionSpec
from gateway.grpc_front.servicer import TensorInputs, _relayed
from schemas.deployment import PassthroughModel
from schemas.proto import tfs_pb2


class _WireClient:
    """A BackendClient stand-in for ``predict_bytes``: records what it was sent, answers ``answer``."""

    target = "fake:1"

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.sent: list[bytes] = []

    async def predict_bytes(self, req: bytes, deadline: float) -> bytes:
        self.sent.append(req)
        return self.answer


def _client_request(**spec: Any) -> tfs_pb2.PredictRequest:
    req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name="client_name", **spec))
    req.inputs["x"].CopyFrom(from_ndarray(np.array([[1.5, -2.0]], dtype=np.float32)))
    req.inputs["ids"].CopyFrom(from_ndarray(np.array([7, 8], dtype=np.int64)))
    return req


def _answer(version: int | None, signature: str = "serving_default") -> tfs_pb2.PredictResponse:
    resp = tfs_pb2.PredictResponse(
        model_spec=tfs_pb2.ModelSpec(name="backend_name", signature_name=signature)
    )
    if version is not None:
        resp.model_spec.version.value = version
    resp.outputs["y"].CopyFrom(from_ndarray(np.array([[0.25]], dtype=np.float32)))
    return resp


def _forward(req: tfs_pb2.PredictRequest, spec: VersionSpec, answer: bytes) -> tuple[Any, bytes]:
    client = _WireClient(answer)
    model = PassthroughModel.model_validate(
        {"kind": "passthrough", "name": "client_name", "target": "fake:1", "backend_name": "backend_name"}
    )
    servable = PassthroughServable(model, client, MetadataCache(60.0))  # type: ignore[arg-type]
    wire = req.SerializeToString()
    inputs = TensorInputs(req.inputs, wire)
    res = asyncio.run(servable.predict(inputs, req.model_spec.signature_name, spec, time.monotonic() + 10))
    (sent,) = client.sent
    return res, sent


@pytest.mark.parametrize(
    ("client_spec", "spec", "version", "label"),
    [
        ({}, VersionSpec(), None, None),  # latest
        ({"version": {"value": 3}}, VersionSpec(version=3), 3, None),
        ({"version_label": "stable"}, VersionSpec(version=5), 5, None),  # a configured label, resolved
        ({"version_label": "canary"}, VersionSpec(label="canary"), None, "canary"),  # passed through
    ],
)
def test_backend_reads_the_served_name_and_resolved_version(
    client_spec: dict[str, Any], spec: VersionSpec, version: int | None, label: str | None
) -> None:
    from tensorflow_serving.apis import predict_pb2

    req = _client_request(signature_name="sig", **client_spec)
    _, sent = _forward(req, spec, _answer(7).SerializeToString())
    seen = predict_pb2.PredictRequest.FromString(sent)  # as TF Serving parses it
    assert seen.model_spec.name == "backend_name"
    assert seen.model_spec.signature_name == "sig"
    assert (seen.model_spec.version.value if seen.model_spec.HasField("version") else None) == version
    assert (seen.model_spec.version_label or None) == label
    assert {k: v.SerializeToString() for k, v in seen.inputs.items()} == {
        k: v.SerializeToString() for k, v in req.inputs.items()
    }
    assert sent.startswith(req.SerializeToString())  # the client's bytes, forwarded as they are


def test_reply_is_the_backends_answer_with_the_clients_name() -> None:
    from tensorflow_serving.apis import predict_pb2

    answer = _answer(7)
    res, _ = _forward(_client_request(), VersionSpec(), answer.SerializeToString())
    assert res.version == 7 and res.signature == "serving_default"
    assert res.wire == answer.SerializeToString()
    reply = predict_pb2.PredictResponse.FromString(_relayed(res.wire, "client_name", res.signature))
    assert reply.model_spec.name == "client_name"
    assert reply.model_spec.version.value == 7
    assert reply.model_spec.signature_name == "serving_default"
    assert reply.outputs["y"].SerializeToString() == answer.outputs["y"].SerializeToString()


def test_reply_signature_defaults_to_the_requested_one() -> None:
    from tensorflow_serving.apis import predict_pb2

    res, _ = _forward(
        _client_request(signature_name="sig"), VersionSpec(), _answer(None, "").SerializeToString()
    )
    assert res.version is None and res.signature == "sig"
    reply = predict_pb2.PredictResponse.FromString(_relayed(res.wire, "client_name", res.signature))
    assert reply.model_spec.signature_name == "sig" and not reply.model_spec.HasField("version")


def test_a_backend_label_in_the_answer_is_not_relayed() -> None:
    answer = _answer(None)
    answer.model_spec.version_label = "stable"
    res, _ = _forward(_client_request(), VersionSpec(), answer.SerializeToString())
    assert res.wire is None  # the front end builds the reply (which names no label), as before
    assert list(res.outputs) == ["y"]
