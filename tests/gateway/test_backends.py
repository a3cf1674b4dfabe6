"""grpc error translation (every StatusCode), deadlines, replica failover (one fake seam: the client)."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from gateway.backends.client import BackendClient, ReplicaSet
from gateway.backends.errors import error_from_rpc, map_grpc_errors
from gateway.errors import HTTP_STATUS, Code, DeadlineExceeded, GatewayError, Unavailable, http_status
from schemas.proto import tfs_pb2


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details


@pytest.mark.parametrize("status", list(grpc.StatusCode))
def test_every_grpc_status_code_maps(status: grpc.StatusCode) -> None:
    with pytest.raises(GatewayError) as e, map_grpc_errors():
        raise _Rpc(status, f"details of {status.name}")
    err = e.value
    expected = Code.UNKNOWN if status is grpc.StatusCode.OK else Code(status.value[0])
    assert err.code is expected
    assert err.message == f"details of {status.name}"
    assert isinstance(err.__cause__, grpc.RpcError)
    assert err.http_status == HTTP_STATUS[expected]


def test_http_table_matches_tf_serving() -> None:
    assert [
        http_status(c)
        for c in (
            Code.INVALID_ARGUMENT,
            Code.NOT_FOUND,
            Code.DEADLINE_EXCEEDED,
            Code.RESOURCE_EXHAUSTED,
            Code.UNAVAILABLE,
            Code.UNIMPLEMENTED,
            Code.FAILED_PRECONDITION,
            Code.CANCELLED,
        )
    ] == [400, 404, 504, 429, 503, 501, 400, 499]
    assert http_status(99) == 500


def test_error_without_details_names_the_code() -> None:
    assert error_from_rpc(_Rpc(grpc.StatusCode.UNAVAILABLE, None)).message == "UNAVAILABLE"


class _Channel:
    """A channel whose calls run ``behaviour(path, request, timeout)``; a stub's request serializer is applied first,
    as grpc does (so a message stub handed bytes fails here too)."""

    def __init__(self, behaviour: Any) -> None:
        self.behaviour = behaviour

    def unary_unary(self, path: str, request_serializer: Any = None, **_: Any) -> Any:
        async def call(req: Any, timeout: float) -> Any:
            if request_serializer is not None:
                request_serializer(req)
            return await self.behaviour(path, req, timeout)

        return call


async def test_deadline_is_passed_and_enforced() -> None:
    seen: list[float] = []

    async def ok(path: str, req: Any, timeout: float) -> Any:
        seen.append(timeout)
        return tfs_pb2.PredictResponse()

    client = BackendClient("t:1", _Channel(ok))  # type: ignore[arg-type]
    await client.predict(tfs_pb2.PredictRequest(), time.monotonic() + 5)
    assert 4.5 < seen[0] <= 5
    with pytest.raises(DeadlineExceeded):
        await client.predict(tfs_pb2.PredictRequest(), time.monotonic() - 0.1)
    assert len(seen) == 1


async def test_replica_failover_and_all_down() -> None:
    calls: list[str] = []

    def behaviour(name: str, fail: bool) -> Any:
        async def run(path: str, req: Any, timeout: float) -> Any:
            calls.append(name)
            if fail:
                raise _Rpc(grpc.StatusCode.UNAVAILABLE, f"{name} down")
            return tfs_pb2.PredictResponse()

        return run

    rs = ReplicaSet(
        [
            BackendClient("a", _Channel(behaviour("a", True))),  # type: ignore[arg-type]
            BackendClient("b", _Channel(behaviour("b", False))),
        ],
        retry_s=60,
    )  # type: ignore[arg-type]
    for _ in range(4):
        await rs.predict(tfs_pb2.PredictRequest(), time.monotonic() + 5)
    assert calls.count("a") == 1  # skipped while marked down
    assert calls.count("b") == 4
    down = ReplicaSet([BackendClient("a", _Channel(behaviour("a", True)))])  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="a down"):
        await down.predict(tfs_pb2.PredictRequest(), time.monotonic() + 5)


async def test_a_serialized_request_fails_over_as_the_same_bytes() -> None:
    """ReplicaSet.predict with bytes (schemas/wire.py framing): each replica tried gets those bytes unchanged."""
    sent: list[tuple[str, Any]] = []

    def behaviour(name: str, fail: bool) -> Any:
        async def run(path: str, req: Any, timeout: float) -> Any:
            sent.append((name, req))
            if fail:
                raise _Rpc(grpc.StatusCode.UNAVAILABLE, f"{name} down")
            return tfs_pb2.PredictResponse(model_spec=tfs_pb2.ModelSpec(name=name))

        return run

    rs = ReplicaSet(
        [
            BackendClient("a", _Channel(behaviour("a", True))),  # type: ignore[arg-type]
            BackendClient("b", _Channel(behaviour("b", False))),  # type: ignore[arg-type]
        ]
    )
    wire = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name="ps")).SerializeToString()
    resp = await rs.predict(wire, time.monotonic() + 5)
    assert resp.model_spec.name == "b"
    assert sent == [("a", wire), ("b", wire)]


def test_backend_channels_reconnect_within_the_configured_backoff() -> None:
    """``grpc.max_reconnect_backoff_s`` caps gRPC's reconnect backoff (its own default grows to 120 s, so a replica
    restarted after a long outage went unseen for up to 2 minutes)."""
    from gateway.backends.channels import channel_config
    from schemas.gateway_settings import GrpcSettings
    from tfs_grpc.channels import channel_options

    assert dict(channel_options(channel_config(GrpcSettings())))["grpc.max_reconnect_backoff_ms"] == 2000
    opts = dict(channel_options(channel_config(GrpcSettings(max_reconnect_backoff_s=0.5))))
    assert opts["grpc.max_reconnect_backoff_ms"] == 500
