"""The native gRPC client of backend Predict calls (``native/src/client.rs``, ``gateway/backends/native_client.py``)
against real ``grpc.aio`` servers on 127.0.0.1, side by side with the ``grpc.aio`` client it replaces: the same
answers, the same statuses and details, deadlines, cancellation, unreachable targets, reconnection, size limits."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from gateway import native
from gateway.backends.client import BackendClient
from gateway.backends.errors import error_for_status
from gateway.backends.native_client import NativeCalls
from gateway.errors import Code, DeadlineExceeded, GatewayError, NotFound, ResourceExhausted, Unavailable
from schemas.gateway_settings import GrpcSettings
from schemas.proto import tfs_pb2
from tfs_grpc.channels import METHODS

pytestmark = pytest.mark.skipif(not native.available(), reason="embedgate_native is not built (make install)")

PREDICT = METHODS["Predict"][0]
Handler = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


class _Server:
    """A grpc.aio server whose Predict runs ``handler`` on the request's bytes; remembers cancelled calls."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.cancelled = 0
        self.calls = 0
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def _predict(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        try:
            return await self.handler(request, context)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def start(self, port: int = 0) -> None:
        handler = grpc.unary_unary_rpc_method_handler(self._predict)
        generic = grpc.method_handlers_generic_handler(
            "tensorflow.serving.PredictionService", {"Predict": handler}
        )
        opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        self.server = grpc.aio.server(options=opts)
        self.server.add_generic_rpc_handlers((generic,))
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop(0)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def _serving(handler: Handler) -> AsyncIterator[_Server]:
    srv = _Server(handler)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@contextlib.asynccontextmanager
async def _clients(
    target: str, max_receive: int = 512 << 20
) -> AsyncIterator[tuple[BackendClient, BackendClient]]:
    """(native, grpc.aio) clients of ``target``."""
    client = native.grpc_client(max_receive)
    assert client is not None
    calls = NativeCalls(client)
    channel = grpc.aio.insecure_channel(
        target,
        options=[
            ("grpc.max_receive_message_length", max_receive),
            ("grpc.max_send_message_length", 64 << 20),
        ],
    )
    try:
        yield BackendClient(target, channel, native=calls), BackendClient(target, channel)
    finally:
        calls.close()
        await channel.close()


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    req = tfs_pb2.PredictRequest.FromString(request)
    resp = tfs_pb2.PredictResponse()
    resp.model_spec.CopyFrom(req.model_spec)
    for k, t in req.inputs.items():
        resp.outputs[k].CopyFrom(t)
    return resp.SerializeToString()


def _request(name: str, n: int) -> bytes:
    req = tfs_pb2.PredictRequest()
    req.model_spec.name = name
    t = req.inputs["x"]
    t.dtype = 1
    t.tensor_shape.dim.add(size=n)
    t.tensor_content = bytes(range(256)) * (n * 4 // 256) + bytes(n * 4 % 256)
    return req.SerializeToString()


def _deadline(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


@pytest.mark.parametrize("n", [0, 1, 1000, 3_000_000])  # up to a 12 MB message each way
async def test_answers_equal_grpc_aio(n: int) -> None:
    async with _serving(_echo) as srv, _clients(srv.target) as (nat, aio):
        req = _request(f"m{n}", n)
        got = await nat.predict_serialized(req, _deadline())
        want = await aio.predict_serialized(req, _deadline())
        assert got == want
        assert got.model_spec.name == f"m{n}"
        assert await nat.predict_bytes(req, _deadline()) == await aio.predict_bytes(req, _deadline())


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(entry) 100% sure"),
        (grpc.StatusCode.INVALID_ARGUMENT, "bad input: é\n[1, 2]"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        (grpc.StatusCode.FAILED_PRECONDITION, "x" * 5000),
        (grpc.StatusCode.INTERNAL, "boom"),
    ],
)
async def test_statuses_and_details_equal_grpc_aio(code: grpc.StatusCode, details: str) -> None:
    async def fail(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(code, details)
        raise AssertionError("abort raises")

    async with _serving(fail) as srv, _clients(srv.target) as (nat, aio):
        errors: list[GatewayError] = []
        for client in (nat, aio):
            with pytest.raises(GatewayError) as e:
                await client.predict_serialized(_request("m", 3), _deadline())
            errors.append(e.value)
        assert [(type(e), e.code, e.message) for e in errors[:1]] == [
            (type(e), e.code, e.message) for e in errors[1:]
        ]
        assert errors[0].code == Code(code.value[0])


async def test_deadline_exceeded_resets_the_call() -> None:
    async def slow(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.sleep(30)
        return b""

    async with _serving(slow) as srv, _clients(srv.target) as (nat, _aio):
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded) as e:
            await nat.predict_serialized(_request("m", 3), _deadline(0.3))
        assert time.monotonic() - start < 10  # the call ends at its deadline, not the handler's
        assert e.value.message == "Deadline Exceeded"
        for _ in range(200):  # the server sees the call end (grpc-timeout sent, then the stream reset)
            if srv.cancelled:
                break
            await asyncio.sleep(0.05)
        assert srv.cancelled == 1


async def test_cancelled_await_cancels_the_call() -> None:
    started = asyncio.Event()

    async def slow(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if tfs_pb2.PredictRequest.FromString(request).model_spec.name != "slow":
            return await _echo(request, context)
        started.set()
        await asyncio.sleep(30)
        return b""

    async with _serving(slow) as srv, _clients(srv.target) as (nat, _aio):
        task = asyncio.ensure_future(nat.predict_serialized(_request("slow", 3), _deadline(30)))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if srv.cancelled:
                break
            await asyncio.sleep(0.05)
        assert srv.cancelled == 1
        # the client keeps working on the same connection
        assert (await nat.predict_serialized(_request("after", 1), _deadline())).model_spec.name == "after"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_nothing_listening_is_unavailable_then_reconnects() -> None:
    port = _free_port()
    target = f"127.0.0.1:{port}"
    async with _clients(target) as (nat, _aio):
        with pytest.raises(Unavailable) as e:
            await nat.predict_serialized(_request("m", 3), _deadline())
        assert target in e.value.message
        srv = _Server(_echo)
        await srv.start(port)
        try:
            got = await nat.predict_serialized(_request("up", 2), _deadline())
            assert got.model_spec.name == "up"
            await srv.stop()  # the connection breaks: the next call is UNAVAILABLE or opens a new one
            with pytest.raises(Unavailable):
                await nat.predict_serialized(_request("m", 3), _deadline())
            srv = _Server(_echo)
            await srv.start(port)
            got = await nat.predict_serialized(_request("again", 2), _deadline())
            assert got.model_spec.name == "again"
        finally:
            await srv.stop()


async def test_answer_over_max_receive_is_resource_exhausted() -> None:
    async with _serving(_echo) as srv, _clients(srv.target, max_receive=1 << 20) as (nat, aio):
        req = _request("big", 1 << 19)  # 2 MB back
        errors = []
        for client in (nat, aio):
            with pytest.raises(ResourceExhausted) as e:
                await client.predict_serialized(req, _deadline())
            errors.append(e.value.message)
        # grpc.aio words it "Stream removed (CLIENT: <the same>)"
        assert re.fullmatch(r"Received message larger than max \(\d+ vs\. 1048576\)", errors[0]), errors[0]
        assert errors[0] in errors[1]
        assert (await nat.predict_serialized(_request("small", 10), _deadline())).model_spec.name == "small"


async def test_request_over_max_send_is_refused_before_it_is_sent() -> None:
    async with _serving(_echo) as srv:
        client = native.grpc_client(1 << 20)
        assert client is not None
        calls = NativeCalls(client, max_send=1000)
        channel = grpc.aio.insecure_channel(srv.target, options=[("grpc.max_send_message_length", 1000)])
        try:
            nat, aio = BackendClient(srv.target, channel, native=calls), BackendClient(srv.target, channel)
            req = _request("big", 300)
            errors = []
            for c in (nat, aio):
                with pytest.raises(ResourceExhausted) as e:
                    await c.predict_serialized(req, _deadline())
                errors.append(e.value.message)
            assert errors[0] == f"Sent message larger than max ({len(req)} vs. 1000)"
            assert errors[0] in errors[1]
            assert srv.calls == 0
            assert (
                await nat.predict_serialized(_request("small", 10), _deadline())
            ).model_spec.name == "small"
        finally:
            calls.close()
            await channel.close()


async def test_concurrent_calls_each_get_their_own_answer() -> None:
    async def later(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        name = tfs_pb2.PredictRequest.FromString(request).model_spec.name
        await asyncio.sleep(0.001 * (int(name) % 7))
        return await _echo(request, context)

    async with _serving(later) as srv, _clients(srv.target) as (nat, _aio):
        answers = await asyncio.gather(
            *(nat.predict_serialized(_request(str(i), 1 + i * 1000), _deadline()) for i in range(64))
        )
        assert [a.model_spec.name for a in answers] == [str(i) for i in range(64)]
        assert [len(a.outputs["x"].tensor_content) for a in answers] == [
            4 * (1 + i * 1000) for i in range(64)
        ]


async def test_close_fails_waiting_calls_and_refuses_new_ones() -> None:
    async def slow(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.sleep(30)
        return b""

    async with _serving(slow) as srv:
        client = native.grpc_client(1 << 20)
        assert client is not None
        calls = NativeCalls(client)
        task = asyncio.ensure_future(calls.unary(srv.target, PREDICT, _request("m", 1), 30))
        await asyncio.sleep(0.2)
        assert calls.running == 1
        calls.close()
        with pytest.raises(Unavailable):
            await task
        with pytest.raises(Unavailable):
            await calls.unary(srv.target, PREDICT, _request("m", 1), 30)


def test_error_for_status_is_error_from_rpc() -> None:
    assert error_for_status(5, "gone").code == Code.NOT_FOUND
    assert isinstance(error_for_status(5, "gone"), NotFound)
    assert error_for_status(0, "").code == Code.UNKNOWN  # OK without a message is not success
    assert error_for_status(99, "").code == Code.UNKNOWN
    assert error_for_status(14, "").message == "UNAVAILABLE"


def test_settings_default_on() -> None:
    assert GrpcSettings().native_client is True
