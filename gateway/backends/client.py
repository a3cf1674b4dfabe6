"""Typed calls to one TF-Serving-compatible gRPC target, each with a deadline; replica sets with failover.

Every call takes ``deadline`` (``time.monotonic()`` seconds): the gRPC timeout is the time left, and a call made after
the deadline fails with DeadlineExceeded without reaching the backend. Clients are task-safe (grpc.aio channels are).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from gateway.backends.errors import map_grpc_errors
from gateway.errors import Code, DeadlineExceeded, GatewayError, Unavailable
from schemas.proto import tfs_pb2

__all__ = ["BackendClient", "CallObserver", "ReplicaSet"]

_PS = "/tensorflow.serving.PredictionService/"
_METHODS: dict[str, tuple[str, Any, Any]] = {
    "Predict": (_PS + "Predict", tfs_pb2.PredictRequest, tfs_pb2.PredictResponse),
    "Classify": (_PS + "Classify", tfs_pb2.ClassificationRequest, tfs_pb2.ClassificationResponse),
    "Regress": (_PS + "Regress", tfs_pb2.RegressionRequest, tfs_pb2.RegressionResponse),
    "GetModelMetadata": (
        _PS + "GetModelMetadata",
        tfs_pb2.GetModelMetadataRequest,
        tfs_pb2.GetModelMetadataResponse,
    ),
    "GetModelStatus": (
        "/tensorflow.serving.ModelService/GetModelStatus",
        tfs_pb2.GetModelStatusRequest,
        tfs_pb2.GetModelStatusResponse,
    ),
}


class CallObserver(Protocol):
    def __call__(self, target: str, method: str, seconds: float, code: str) -> None: ...


def _no_observer(target: str, method: str, seconds: float, code: str) -> None:
    return None


class BackendClient:
    """Calls on one target's channel (the channel is owned by the lifespan)."""

    def __init__(self, target: str, channel: grpc.aio.Channel, observe: CallObserver = _no_observer) -> None:
        self.target = target
        self._observe = observe
        self._stubs: dict[str, Callable[..., Any]] = {
            name: channel.unary_unary(
                path, request_serializer=req.SerializeToString, response_deserializer=resp.FromString
            )
            for name, (path, req, resp) in _METHODS.items()
        }
        # Predict with serialized messages in and out (pass-through forwarding: no re-serialization)
        self._predict_bytes = channel.unary_unary(_METHODS["Predict"][0])

    async def _call(
        self, method: str, request: Any, deadline: float, stub: Callable[..., Any] | None = None
    ) -> Any:
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            self._observe(self.target, method, 0.0, Code.DEADLINE_EXCEEDED.name)
            raise DeadlineExceeded(f"Deadline exceeded before calling {method} on {self.target}")
        start = time.perf_counter()
        code = "OK"
        try:
            with map_grpc_errors():
                return await (stub or self._stubs[method])(request, timeout=timeout)
        except GatewayError as exc:
            code = exc.code.name
            raise
        finally:
            self._observe(self.target, method, time.perf_counter() - start, code)

    async def predict(self, req: tfs_pb2.PredictRequest, deadline: float) -> tfs_pb2.PredictResponse:
        return await self._call("Predict", req, deadline)  # type: ignore[no-any-return]

    async def predict_bytes(self, req: bytes, deadline: float) -> bytes:
        """Predict with a serialized PredictRequest; returns the serialized PredictResponse as the backend sent it."""
        return await self._call("Predict", req, deadline, self._predict_bytes)  # type: ignore[no-any-return]

    async def classify(
        self, req: tfs_pb2.ClassificationRequest, deadline: float
    ) -> tfs_pb2.ClassificationResponse:
        return await self._call("Classify", req, deadline)  # type: ignore[no-any-return]

    async def regress(self, req: tfs_pb2.RegressionRequest, deadline: float) -> tfs_pb2.RegressionResponse:
        return await self._call("Regress", req, deadline)  # type: ignore[no-any-return]

    async def get_model_metadata(
        self, req: tfs_pb2.GetModelMetadataRequest, deadline: float
    ) -> tfs_pb2.GetModelMetadataResponse:
        return await self._call("GetModelMetadata", req, deadline)  # type: ignore[no-any-return]

    async def get_model_status(
        self, req: tfs_pb2.GetModelStatusRequest, deadline: float
    ) -> tfs_pb2.GetModelStatusResponse:
        return await self._call("GetModelStatus", req, deadline)  # type: ignore[no-any-return]


class ReplicaSet:
    """Replicas serving the same PS servable: calls go to a healthy one, round robin; UNAVAILABLE fails over.

    A replica that answered UNAVAILABLE is tried last for ``retry_s`` seconds. The error of the last replica tried is
    raised when every replica fails.
    """

    def __init__(self, clients: list[BackendClient], retry_s: float = 5.0) -> None:
        if not clients:
            raise ValueError("a replica set needs at least one client")
        self.clients = clients
        self._retry_s = retry_s
        self._down_until = [0.0] * len(clients)
        self._next = 0

    def _order(self) -> list[int]:
        n = len(self.clients)
        start = self._next
        self._next = (self._next + 1) % n
        idx = [(start + i) % n for i in range(n)]
        now = time.monotonic()
        return [i for i in idx if self._down_until[i] <= now] + [i for i in idx if self._down_until[i] > now]

    async def predict(self, req: tfs_pb2.PredictRequest, deadline: float) -> tfs_pb2.PredictResponse:
        last: Unavailable | None = None
        for i in self._order():
            try:
                resp = await self.clients[i].predict(req, deadline)
            except Unavailable as exc:
                self._down_until[i] = time.monotonic() + self._retry_s
                last = exc
                continue
            self._down_until[i] = 0.0
            return resp
        assert last is not None
        raise last
