"""A TF-Serving-shaped gRPC backend in the test process that counts and can hold calls (for deadline tests only).

Serves one model ``m`` (signature ``serving_default``: input ``x`` DT_FLOAT, output ``y``) with ModelService
GetModelStatus and PredictionService GetModelMetadata / Predict. ``hold_metadata`` makes GetModelMetadata wait until
``release`` (bounded), and records whether the caller cancelled the call. Everything else about the gateway under test
is real (uvicorn subprocess, real gRPC).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from schemas.proto import tfs_pb2
from tests.support.ports import free_port

__all__ = ["METADATA", "FakeBackend", "call_metadata", "fake_backend"]

METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"

_HOLD_LIMIT_S = 30.0


@dataclass
class FakeBackend:
    target: str = ""
    calls: dict[str, int] = field(default_factory=lambda: {"Predict": 0, "GetModelMetadata": 0})
    hold_metadata: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    metadata_cancelled: threading.Event = field(default_factory=threading.Event)
    metadata_started: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _count(self, method: str) -> None:
        with self.lock:
            self.calls[method] += 1

    def status(self, req: tfs_pb2.GetModelStatusRequest, ctx: Any) -> tfs_pb2.GetModelStatusResponse:
        resp = tfs_pb2.GetModelStatusResponse()
        st = resp.model_version_status.add()
        st.version = 1
        st.state = tfs_pb2.ModelVersionStatus.AVAILABLE
        return resp

    def metadata(self, req: tfs_pb2.GetModelMetadataRequest, ctx: Any) -> tfs_pb2.GetModelMetadataResponse:
        self._count("GetModelMetadata")
        if self.hold_metadata:
            ctx.add_callback(lambda: self.metadata_cancelled.set())
            self.metadata_started.set()
            self.release.wait(_HOLD_LIMIT_S)
        sigmap = tfs_pb2.SignatureDefMap()
        sig = sigmap.signature_def["serving_default"]
        sig.method_name = "tensorflow/serving/predict"
        sig.inputs["x"].name = "x:0"
        sig.inputs["x"].dtype = tfs_pb2.DataType.DT_FLOAT
        sig.outputs["y"].name = "y:0"
        sig.outputs["y"].dtype = tfs_pb2.DataType.DT_FLOAT
        resp = tfs_pb2.GetModelMetadataResponse()
        resp.model_spec.name = req.model_spec.name
        resp.model_spec.version.value = 1
        resp.metadata["signature_def"].Pack(sigmap)
        return resp

    def predict(self, req: tfs_pb2.PredictRequest, ctx: Any) -> tfs_pb2.PredictResponse:
        self._count("Predict")
        resp = tfs_pb2.PredictResponse()
        resp.model_spec.name = req.model_spec.name
        resp.model_spec.version.value = 1
        y = resp.outputs["y"]
        y.dtype = tfs_pb2.DataType.DT_FLOAT
        y.tensor_shape.dim.add().size = 1
        y.float_val.append(1.0)
        return resp


def _handler(fn: Any, req: Any, resp: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
    )


@contextmanager
def fake_backend() -> Iterator[FakeBackend]:
    fb = FakeBackend()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.max_receive_message_length", 1 << 30)]
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "tensorflow.serving.ModelService",
                {
                    "GetModelStatus": _handler(
                        fb.status, tfs_pb2.GetModelStatusRequest, tfs_pb2.GetModelStatusResponse
                    )
                },
            ),
            grpc.method_handlers_generic_handler(
                "tensorflow.serving.PredictionService",
                {
                    "GetModelMetadata": _handler(
                        fb.metadata, tfs_pb2.GetModelMetadataRequest, tfs_pb2.GetModelMetadataResponse
                    ),
                    "Predict": _handler(fb.predict, tfs_pb2.PredictRequest, tfs_pb2.PredictResponse),
                },
            ),
        )
    )
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    fb.target = f"127.0.0.1:{port}"
    try:
        yield fb
    finally:
        fb.release.set()
        server.stop(grace=None)


def call_metadata(target: str, model: str = "m", timeout: float = _HOLD_LIMIT_S * 2) -> grpc.StatusCode:
    """One blocking GetModelMetadata call of ``model`` to ``target`` (a gateway's gRPC port); its status code."""
    req = tfs_pb2.GetModelMetadataRequest(
        model_spec=tfs_pb2.ModelSpec(name=model), metadata_field=["signature_def"]
    )
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            METADATA, request_serializer=tfs_pb2.GetModelMetadataRequest.SerializeToString
        )
        try:
            call(req, timeout=timeout)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            return code
    return grpc.StatusCode.OK
