"""serve-local's two gRPC fronts give the same answers: the native gate (``Predict`` received natively, answered by
worker threads; the rest relayed) and the Python gRPC server on the port itself (``EMBEDGATE_SERVE_FRONT=python``,
the reference). Real serve-local processes, real gRPC clients on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from embedgate.localserve.front import FRONT_ENV, PREDICT_PATH, serve_call
from tests.support.native import env_set
from tests.support.servers import LocalServer, serve_local

_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


@pytest.fixture(scope="module")
def fronts(model_root: Path) -> Iterator[dict[str, LocalServer]]:
    with (
        serve_local(model_root / "models.config") as gate,
        env_set(FRONT_ENV, "python"),
        serve_local(model_root / "models.config") as python,
    ):
        yield {"gate": gate, "python": python}


def _request(model: str, x: np.ndarray, **spec: Any) -> predict_pb2.PredictRequest:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    for k, v in spec.items():
        setattr(req.model_spec, k, v)
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    return req


def _call(server: LocalServer, fn: Any) -> Any:
    with grpc.insecure_channel(server.target, options=_OPTIONS) as ch:
        return fn(ch)


def _outcome(server: LocalServer, request: bytes, **kw: Any) -> tuple[str, str, predict_pb2.PredictResponse]:
    """(status name, details, response) of one Predict sent as raw bytes (maps compare regardless of order)."""

    def go(ch: grpc.Channel) -> tuple[str, str, predict_pb2.PredictResponse]:
        predict = ch.unary_unary(PREDICT_PATH, response_deserializer=predict_pb2.PredictResponse.FromString)
        try:
            return "OK", "", predict(request, timeout=30, **kw)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or "", predict_pb2.PredictResponse()  # type: ignore[attr-defined]

    result: tuple[str, str, predict_pb2.PredictResponse] = _call(server, go)
    return result


@pytest.mark.integration
def test_predict_answers_and_errors_are_the_same_on_both_fronts(fronts: dict[str, LocalServer]) -> None:
    big = np.arange(3_000_000, dtype=np.float32)  # 12 MB: many HTTP/2 frames
    cases = {
        "ok": _request("half", np.array([1, 2, 3], np.float32)),
        "label": _request("half", np.array([1.0], np.float32), version_label="stable"),
        "big": _request("half", big),
        "not found": _request("nope", np.array([1.0], np.float32)),
        "bad signature": _request("half", np.array([1.0], np.float32), signature_name="nope"),
        "bad dtype": _request("half", np.array([1, 2], np.int64)),
    }
    raw = {name: req.SerializeToString() for name, req in cases.items()}
    raw["malformed"] = b"\xff\xff\xff\x0f"
    raw["empty"] = b""
    got = {
        front: {name: _outcome(server, body) for name, body in raw.items()}
        for front, server in fronts.items()
    }
    for name in raw:
        assert got["gate"][name] == got["python"][name], name
    assert got["gate"]["ok"][0] == "OK" and got["gate"]["big"][0] == "OK"
    out = got["gate"]["big"][2]
    np.testing.assert_array_equal(tf.make_ndarray(out.outputs["y"])[-2:], big[-2:] / 2 + 2)
    assert got["gate"]["not found"][:2] == ("NOT_FOUND", "Servable not found for request: Latest(nope)")
    assert got["gate"]["malformed"][0] == "INVALID_ARGUMENT"
    # compressed calls are relayed to the Python server, which decompresses them
    assert _outcome(fronts["gate"], raw["ok"], compression=grpc.Compression.Gzip) == got["python"]["ok"]


@pytest.mark.integration
def test_other_methods_are_relayed(fronts: dict[str, LocalServer]) -> None:
    req = get_model_metadata_pb2.GetModelMetadataRequest()
    req.model_spec.name = "half"
    req.metadata_field.append("signature_def")
    answers = [
        _call(s, lambda ch: prediction_service_pb2_grpc.PredictionServiceStub(ch).GetModelMetadata(req, 10))
        for s in (fronts["gate"], fronts["python"])
    ]
    assert answers[0].model_spec == answers[1].model_spec

    def signatures(resp: get_model_metadata_pb2.GetModelMetadataResponse) -> Any:
        out = get_model_metadata_pb2.SignatureDefMap()
        resp.metadata["signature_def"].Unpack(out)
        return out

    assert signatures(answers[0]) == signatures(answers[1])  # (an Any's bytes hold a map in no fixed order)
    assert "serving_default" in signatures(answers[0]).signature_def


@pytest.mark.integration
def test_a_unary_call_with_two_messages_or_none_is_the_clients_error(fronts: dict[str, LocalServer]) -> None:
    one = _request("half", np.array([1.0], np.float32)).SerializeToString()

    def send(messages: list[bytes]) -> grpc.StatusCode:
        def go(ch: grpc.Channel) -> grpc.StatusCode:
            call = ch.stream_unary(PREDICT_PATH)
            try:
                call(iter(messages), timeout=10)
            except grpc.RpcError as exc:
                code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
                return code
            return grpc.StatusCode.OK

        code: grpc.StatusCode = _call(fronts["gate"], go)
        return code

    assert send([one, one]) == grpc.StatusCode.INVALID_ARGUMENT
    assert send([]) == grpc.StatusCode.INVALID_ARGUMENT
    assert _outcome(fronts["gate"], one)[0] == "OK"  # and the server goes on


@pytest.mark.integration
def test_concurrent_and_cancelled_calls(fronts: dict[str, LocalServer]) -> None:
    server = fronts["gate"]
    xs = [np.full(1000 + i, i, np.float32) for i in range(48)]
    with grpc.insecure_channel(server.target, options=_OPTIONS) as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        futures = [stub.Predict.future(_request("half", x), 30) for x in xs]
        futures[5].cancel()  # a client cancel mid-flight does not disturb the others
        for i, (x, f) in enumerate(zip(xs, futures, strict=True)):
            if i == 5:
                continue
            np.testing.assert_array_equal(tf.make_ndarray(f.result().outputs["y"]), x / 2 + 2)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda x: _outcome(server, _request("half", x).SerializeToString()), xs[:16]))
    assert all(o[0] == "OK" for o in outs)


class _FakeCall:
    """What serve_call uses of a call the gate took (a unit test of this module only)."""

    def __init__(self, message: bytes) -> None:
        self.message = message
        self.answer: tuple[Any, ...] | None = None

    def take_message(self) -> bytes:
        return self.message

    def time_remaining(self) -> float | None:
        return 2.5

    def metadata(self) -> list[tuple[str, bytes]]:
        return [("x-a", b"1"), ("x-b-bin", b"AP8")]  # base64 without its padding

    def respond(self, code: int, details: str, body: bytes | None = None) -> bool:
        self.answer = (code, details, body)
        return True


def test_serve_call_answers_the_message_the_abort_or_internal() -> None:
    def echo(raw: bytes, ctx: Any) -> predict_pb2.PredictResponse:
        assert ctx.time_remaining() == 2.5 and ctx.invocation_metadata() == (
            ("x-a", "1"),
            ("x-b-bin", b"\x00\xff"),
        )
        resp = predict_pb2.PredictResponse()
        resp.model_spec.name = raw.decode()
        return resp

    call = _FakeCall(b"m")
    serve_call(call, echo)
    assert call.answer == (0, "", predict_pb2.PredictResponse(model_spec={"name": "m"}).SerializeToString())

    def refuse(raw: bytes, ctx: Any) -> predict_pb2.PredictResponse:
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such model")
        raise AssertionError("abort returned")

    call = _FakeCall(b"")
    serve_call(call, refuse)
    assert call.answer == (5, "no such model", None)

    def broken(raw: bytes, ctx: Any) -> predict_pb2.PredictResponse:
        raise KeyError("internal detail")

    call = _FakeCall(b"")
    serve_call(call, broken)
    assert call.answer == (13, "Unexpected KeyError", None)
