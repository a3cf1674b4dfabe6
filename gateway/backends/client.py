"""Typed calls to one TF-Serving-compatible gRPC target, each with a deadline; replica sets with failover.

Every call takes ``deadline`` (``time.monotonic()`` seconds): the gRPC timeout is the time left, and a call made after
the deadline fails with DeadlineExceeded without reaching the backend. Clients are task-safe (grpc.aio channels are).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from gateway.backends.errors import map_grpc_errors
from gateway.errors import Code, DeadlineExceeded, GatewayError, Unavailable
from schemas.proto import tfs_pb2
from tfs_grpc.channels import METHODS, stub

if TYPE_CHECKING:
    from gateway.backends.native_client import NativeCalls

__all__ = ["BackendClient", "CallObserver", "ReplicaSet"]


class CallObserver(Protocol):
    def __call__(self, target: str, method: str, seconds: float, code: str) -> None: ...


def _no_observer(target: str, method: str, seconds: float, code: str) -> None:
    return None


class BackendClient:
    """Calls on one target's channel (the channel is owned by the lifespan). With ``native``, the Predict calls of
    serialized requests (the entry's, the PS lookups', pass-through forwarding) go through the native client instead
    (:mod:`gateway.backends.native_client`); every other call through the channel."""

    def __init__(
        self,
        target: str,
        channel: grpc.aio.Channel,
        observe: CallObserver = _no_observer,
        native: NativeCalls | None = None,
    ) -> None:
        self.target = target
        self._observe = observe
        self._stubs: dict[str, Callable[..., Any]] = {name: stub(channel, name) for name in METHODS}
        # a Predict on a PS's ``stream_position`` signature, under its own name in the backend call metrics
        self._stubs["StreamPosition"] = self._stubs["Predict"]
        # Predict with serialized messages in and out (pass-through forwarding: no re-serialization)
        self._predict_bytes: Callable[..., Any] = stub(
            channel, "Predict", serialized=True, serialized_response=True
        )
        # Predict with a serialized request and a parsed answer (the entry's request, framed from the arrays)
        self._predict_serialized: Callable[..., Any] = stub(channel, "Predict", serialized=True)
        if native is not None:
            path = METHODS["Predict"][0]

            # ``timeout``: the keyword a grpc.aio stub takes, as :meth:`_call` passes it
            async def predict_bytes(req: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
                return await native.unary(target, path, req, timeout)

            async def predict_serialized(req: bytes, timeout: float) -> tfs_pb2.PredictResponse:  # noqa: ASYNC109
                resp: tfs_pb2.PredictResponse = tfs_pb2.PredictResponse.FromString(
                    await native.unary(target, path, req, timeout)
                )
                return resp

            self._predict_bytes = predict_bytes
            self._predict_serialized = predict_serialized

    async def _call(
        self, method: str, request: Any, deadline: float, call: Callable[..., Any] | None = None
    ) -> Any:
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            self._observe(self.target, method, 0.0, Code.DEADLINE_EXCEEDED.name)
            raise DeadlineExceeded(f"Deadline exceeded before calling {method} on {self.target}")
        start = time.perf_counter()
        code = "OK"
        try:
            with map_grpc_errors():
                return await (call or self._stubs[method])(request, timeout=timeout)
        except GatewayError as exc:
            code = exc.code.name
            raise
        finally:
            self._observe(self.target, method, time.perf_counter() - start, code)

    async def predict(self, req: tfs_pb2.PredictRequest, deadline: float) -> tfs_pb2.PredictResponse:
        return await self._call("Predict", req, deadline)  # type: ignore[no-any-return]

    async def predict_serialized(self, req: bytes, deadline: float) -> tfs_pb2.PredictResponse:
        """Predict with a serialized PredictRequest; returns the parsed answer."""
        return await self._call("Predict", req, deadline, self._predict_serialized)  # type: ignore[no-any-return]

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

    async def stream_position(self, req: tfs_pb2.PredictRequest, deadline: float) -> tfs_pb2.PredictResponse:
        """``Predict`` of a PS ``stream_position`` request, observed as method ``StreamPosition``."""
        return await self._call("StreamPosition", req, deadline)  # type: ignore[no-any-return]


class ReplicaSet:
    """Replicas serving the same PS servable: calls go to a healthy, caught-up one, round robin; UNAVAILABLE fails
    over.

    A replica that answered UNAVAILABLE is tried last for ``retry_s`` seconds. ``catching_up[i]`` (set by
    :class:`gateway.core.positions.PositionTracker` from the stream positions the replicas report) says replica ``i``
    lacks rows the others have: it is tried after every caught-up replica. The order is: reachable and caught up,
    reachable and catching up, then the replicas marked down (caught up first); round robin within each group. A
    call is never refused because replicas are catching up. ``stale_reads`` counts the calls answered by a replica
    marked catching up (only ever grows). The error of the last replica tried is raised when every replica fails.
    Task-safe within one event loop.
    """

    def __init__(self, clients: list[BackendClient], retry_s: float = 5.0) -> None:
        if not clients:
            raise ValueError("a replica set needs at least one client")
        self.clients = clients
        self._retry_s = retry_s
        self._down_until = [0.0] * len(clients)
        self._next = 0
        self.catching_up = [False] * len(clients)
        self.stale_reads = 0

    def set_catching_up(self, flags: list[bool]) -> None:
        """Which replicas are catching up (one flag per client, in order)."""
        if len(flags) != len(self.clients):
            raise ValueError(f"{len(flags)} flags for {len(self.clients)} replicas")
        self.catching_up = list(flags)

    def _order(self) -> list[int]:
        n = len(self.clients)
        start = self._next
        self._next = (self._next + 1) % n
        idx = [(start + i) % n for i in range(n)]
        now = time.monotonic()
        behind = self.catching_up
        return sorted(idx, key=lambda i: (self._down_until[i] > now, behind[i]))  # stable: round robin kept

    async def predict(self, req: tfs_pb2.PredictRequest | bytes, deadline: float) -> tfs_pb2.PredictResponse:
        """``req`` as a message or already serialized (schemas/wire.py): sent as is to each replica tried."""
        last: Unavailable | None = None
        for i in self._order():
            client = self.clients[i]
            try:
                if isinstance(req, bytes):
                    resp = await client.predict_serialized(req, deadline)
                else:
                    resp = await client.predict(req, deadline)
            except Unavailable as exc:
                self._down_until[i] = time.monotonic() + self._retry_s
                last = exc
                continue
            self._down_until[i] = 0.0
            if self.catching_up[i]:
                self.stale_reads += 1
            return resp
        assert last is not None
        raise last
