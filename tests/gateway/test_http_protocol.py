"""The gateway's HTTP protocol (``gateway.http_protocol``): refusals under overload before the ASGI request, the
connection kept or closed after them, and the request head bounded while it is read. Real uvicorn servers on
127.0.0.1, raw sockets as clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from gateway.admission import JUDGED, PENDING, Pending, Shedder, settle
from gateway.metrics import Metrics
from gateway.servers import limit_options
from schemas.gateway_settings import GatewaySettings
from tests.support.ports import free_port

_MODELS = [{"kind": "passthrough", "name": "m", "target": "127.0.0.1:1"}]
_SATURATED: dict[str, Any] = {"max_in_flight": 1, "admission": {"adaptive": False, "queue_timeout_s": 0}}


def _settings(**over: Any) -> GatewaySettings:
    return GatewaySettings.model_validate({"models": _MODELS, **over})


@contextlib.asynccontextmanager
async def _serving(app: Any, settings: GatewaySettings) -> AsyncIterator[int]:
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, access_log=False, **limit_options(settings)
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def _connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a content-length: (status, headers, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 30)
    return int(lines[0].split()[1]), headers, body


def _predict(body: bytes, extra: str = "") -> bytes:
    return (
        f"POST /v1/models/m:predict HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_refused_request_keeps_the_connection_and_its_body_is_skipped(parser: str) -> None:
    """The same answer and counts on either parser; the next request on the connection is read correctly."""
    from gateway.app import create_app

    settings = _settings(limits={"http_parser": parser}, **_SATURATED)
    app = create_app(settings)
    async with _serving(app, settings) as port:
        rt = app.state.runtime
        rt.limiter.acquire()  # the only slot: every /v1 request is refused at once
        async with _connection(port) as (reader, writer):
            body = json.dumps({"instances": [[1.0] * 500]}).encode()
            request = _predict(body)
            split = len(request) - len(body) + 10
            writer.write(request[:split])  # the refusal does not wait for the body
            status, headers, answer = await _response(reader)
            assert status == 429, answer
            assert "max_in_flight=1" in json.loads(answer)["error"]
            assert headers["retry-after"] and "connection" not in headers and "x-request-id" not in headers
            writer.write(request[split:] + _HEALTHZ)
            status, headers, _ = await _response(reader)
            assert (
                status == 200 and "x-request-id" in headers
            )  # the body was skipped, /healthz is never refused
            writer.write(_predict(body) + _predict(body))  # two at once: both refused, in order
            assert [(await _response(reader))[0] for _ in range(2)] == [429, 429]
        sample = rt.metrics.registry.get_sample_value
        assert sample("embedgate_admission_shed_total", {"reason": "queue_full"}) == 3
        assert sample("embedgate_requests_rejected_total") == 3


@pytest.mark.parametrize(
    ("extra", "request_line"),
    [("Connection: close\r\n", "HTTP/1.1"), ("", "HTTP/1.0"), ("Expect: 100-continue\r\n", "HTTP/1.1")],
)
async def test_a_refusal_closes_the_connection_when_the_client_does_not_keep_it(
    extra: str, request_line: str
) -> None:
    from gateway.app import create_app

    settings = _settings(**_SATURATED)
    app = create_app(settings)
    async with _serving(app, settings) as port:
        app.state.runtime.limiter.acquire()
        async with _connection(port) as (reader, writer):
            writer.write(_predict(b"{}", extra).replace(b"HTTP/1.1", request_line.encode(), 1))
            status, headers, _ = await _response(reader)
            assert status == 429 and headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the server


async def test_the_refusal_is_written_before_the_app_sees_the_request() -> None:
    """With a shedder that refuses, the ASGI app is not called for /v1 requests (it is for the others)."""
    settings = _settings()
    seen: list[str] = []

    class Refusing:
        def refusal(
            self, path: str, scope: object = None
        ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
            return (429, [(b"content-length", b"2")], b"no") if path.startswith("/v1/") else None

        def pend(self, scope: object) -> None:
            pass

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    app.state = SimpleNamespace(runtime=SimpleNamespace(settings=settings), shedder=Refusing())  # type: ignore[attr-defined]
    async with _serving(app, settings) as port, _connection(port) as (reader, writer):
        writer.write(_predict(b"{}") + _HEALTHZ)
        assert (await _response(reader))[::2] == (429, b"no")
        assert (await _response(reader))[::2] == (200, b"ok")
    assert seen == ["/healthz"]


def test_the_shedder_only_refuses_v1_paths_while_saturated() -> None:
    from gateway.admission import Admission
    from schemas.gateway_settings import AdmissionSettings

    metrics = Metrics()
    adm = Admission(1, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=0), metrics)
    shed = Shedder(adm, metrics)
    reported: list[int] = []  # the REST gate's `seen`: once per /v1 request judged, whatever becomes of it
    shed.on_seen = lambda: reported.append(1)
    assert (
        shed.refusal("/v1/models/m:predict") is None
    )  # judged without a scope (the middleware): reported now
    assert len(reported) == 1
    # let through with its scope: judged; pending once its body is in, until admission counts it (the route) or the
    # request ends (the middleware, after which a body completing makes nothing pending)
    scope: dict[str, object] = {}
    assert shed.refusal("/v1/models/m:predict", scope) is None
    assert scope == {JUDGED: True} and adm.pending == 0  # a slow sender's body is still coming: not pending
    assert len(reported) == 1  # not yet: its body is still coming
    shed.pend(scope)
    assert adm.pending == 1 and isinstance(scope[PENDING], Pending) and len(reported) == 2
    settle(scope)
    settle(dict(scope))  # a copy of the scope holds the same Pending: counted once
    shed.pend(scope)  # never pending twice
    assert adm.pending == 0
    shed.end(scope)
    assert len(reported) == 2  # reported once
    ended: dict[str, object] = {JUDGED: True, PENDING: None}
    shed.pend(ended)
    assert adm.pending == 0
    early: dict[str, object] = {}
    assert shed.refusal("/v1/models/m:predict", early) is None
    shed.end(early)  # ended before its body was in: reported at its end, never pending
    shed.pend(early)
    assert len(reported) == 3 and adm.pending == 0
    scope = {}
    assert shed.refusal("/healthz", scope) is None
    shed.pend(scope)
    assert scope == {} and adm.pending == 0  # never judged, never pending
    adm.acquire()
    assert shed.refusal("/healthz") is None
    refusal = shed.refusal("/V1/models/m:predict", scope)
    assert refusal is not None and refusal[0] == 429
    assert adm.pending == 0 and scope == {} and len(reported) == 4  # refused: reported at once


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_head_still_incomplete_past_the_bound_is_cut_while_read(parser: str) -> None:
    from gateway.app import create_app

    settings = _settings(limits={"http_parser": parser})
    app = create_app(settings)
    async with _serving(app, settings) as port, _connection(port) as (reader, writer):
        # a head that never ends: without the bound the server would wait for the rest of it, not answer
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nx-huge: " + b"a" * (1 << 20))
        with contextlib.suppress(ConnectionError):  # the server may close before it has read everything
            await writer.drain()
        try:
            status, _, body = await _response(reader)
            assert status == 400 and b"Request" in body
            assert await asyncio.wait_for(reader.read(), 30) == b""
        except ConnectionResetError:  # closed with the rest unread: the kernel may drop the 400 for the reset
            pass


async def test_an_upgrade_request_is_not_refused_by_the_protocol() -> None:
    """A WebSocket upgrade to a /v1 path goes the ordinary way even while /v1 requests are refused (the gateway has no
    WebSocket routes: it is turned away, not answered with a 429 and then upgraded)."""
    from gateway.app import create_app

    settings = _settings(**_SATURATED)
    app = create_app(settings)
    async with _serving(app, settings) as port, _connection(port) as (reader, writer):
        app.state.runtime.limiter.acquire()
        writer.write(
            b"GET /v1/models/m HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        status, _, _ = await _response(reader)
        assert status == 403


async def test_a_request_is_pending_from_its_whole_body_to_its_admission_or_end() -> None:
    """Through the real protocol and ShedMiddleware: a /v1 request is pending (``Admission.pending``) only once its
    body is in and until the app settles it or the request ends; one the app answered before its body was in (a 401)
    leaves nothing pending when the rest of the body comes."""
    from gateway.admission import Admission, ShedMiddleware
    from schemas.gateway_settings import AdmissionSettings

    settings = _settings()
    metrics = Metrics()
    adm = Admission(4, 429, 1, AdmissionSettings(adaptive=False, queue_timeout_s=0), metrics)
    shed = Shedder(adm, metrics)
    pending_seen: list[int] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].endswith(":early"):  # answers before reading its body
            status = 401
        else:
            while (await receive()).get("more_body"):
                pass
            pending_seen.append(adm.pending)  # the route's admission would settle it here
            settle(scope)
            status = 200
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    app = ShedMiddleware(inner, shed)
    app.state = SimpleNamespace(runtime=SimpleNamespace(settings=settings), shedder=shed)  # type: ignore[attr-defined]
    async with _serving(app, settings) as port, _connection(port) as (reader, writer):
        writer.write(_predict(b'{"instances": [1]}'))
        assert (await _response(reader))[0] == 200
        assert pending_seen == [1] and adm.pending == 0
        early = b'{"instances": [1]}'
        head = _predict(early).replace(b"m:predict", b"m:early")
        writer.write(head[: -len(early)] + early[:3])  # the head and part of the body
        assert (await _response(reader))[0] == 401
        writer.write(early[3:])  # the rest comes after the answer
        await writer.drain()
        writer.write(_predict(b"{}"))
        assert (await _response(reader))[0] == 200
        assert pending_seen == [1, 1] and adm.pending == 0
