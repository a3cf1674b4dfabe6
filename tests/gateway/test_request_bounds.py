"""Issue 21 item 8: an empty tokens file at reload keeps the old tokens; the request line is bounded like the headers
(``limits.max_header_bytes``: 414); two Authorization values are refused on both fronts (401 / UNAUTHENTICATED)."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auth import Authenticator
from gateway.errors import Unauthenticated
from schemas.gateway_settings import GatewaySettings
from tests.support.ports import free_port

_MODELS = [{"kind": "passthrough", "name": "m", "target": "127.0.0.1:1"}]


def test_an_empty_tokens_file_at_reload_keeps_the_old_tokens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    path.write_text("old-token\n")
    auth = Authenticator(path, reload_interval_s=0)
    for n, empty in enumerate(("", "# every token removed\n\n"), start=1):
        caplog.clear()
        path.write_text(empty)
        os.utime(path, ns=(n, n))
        with caplog.at_level(logging.WARNING, logger="embedgate.gateway"):
            auth.check("Bearer old-token", "m")  # still valid
        assert any("keeping the previous tokens" in r.getMessage() for r in caplog.records), caplog.records
    path.write_text("new-token\n")
    os.utime(path, ns=(9, 9))
    auth.check("Bearer new-token", "m")  # a file with tokens is used again
    with pytest.raises(Unauthenticated):
        auth.check("Bearer old-token", "m")


def test_several_authorization_values_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("good\nother\n")
    auth = Authenticator(path)
    auth.check(["Bearer good"], "m")
    with pytest.raises(Unauthenticated, match="Missing bearer token"):
        auth.check([], "m")
    for values in (
        ["Bearer good", "Bearer good"],
        ["Bearer good", "Bearer other"],
        ["Bearer wrong", "Bearer good"],
    ):
        with pytest.raises(Unauthenticated, match="2 Authorization values"):
            auth.check(values, "m")


@pytest.mark.parametrize(
    ("query_bytes", "status"),
    [(8_000, 200), (16_400, 414), (17_000, 414), (60_000, 414)],  # httpx refuses URLs over 64 KiB
)
async def test_the_request_line_is_bounded(query_bytes: int, status: int) -> None:
    from gateway.app import create_app

    app = create_app(GatewaySettings(models=_MODELS))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        r = await client.get("/healthz", params={"q": "x" * query_bytes})
        assert r.status_code == status, r.text[:200]
        if status == 414:
            assert "limits.max_header_bytes" in r.json()["error"]
        r = await client.post("/v1/models/" + "m" * query_bytes + ":predict", content=b"{}")
        assert r.status_code == (414 if status == 414 else 404)


async def test_request_line_and_headers_count_together() -> None:
    from gateway.app import create_app

    app = create_app(GatewaySettings(models=_MODELS))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        r = await client.get("/healthz", params={"q": "x" * 9_000}, headers={"x-pad": "y" * 9_000})
        assert r.status_code == 431 and "Request line and headers too large" in r.json()["error"]


@pytest.mark.integration
@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_a_real_gateway_refuses_long_request_lines(tmp_path: Path, parser: str) -> None:
    """Over a socket: 414 from the gateway, or (h11, a head still incomplete past the bound) uvicorn's plain 400."""
    import yaml

    from tests.gateway.fake_backend import fake_backend
    from tests.support.gateway import run_gateway

    with fake_backend() as fb:
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(
            yaml.safe_dump({"models": [{"kind": "passthrough", "name": "m", "target": fb.target}]})
        )
        with run_gateway(cfg, env={"EMBEDGATE_LIMITS__HTTP_PARSER": parser}) as gw:
            for line_bytes in (17_000, 50_000, 100_000):
                with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as sock:
                    sock.sendall(b"GET /healthz?q=" + b"x" * line_bytes + b" HTTP/1.1\r\nHost: gw\r\n\r\n")
                    head = sock.recv(4096).split(b"\r\n", 1)[0]
                assert head.startswith(b"HTTP/1.1 ") and head.split()[1] in (b"414", b"400"), (
                    line_bytes,
                    head,
                )
            ok = httpx.get(f"{gw.url}/healthz", params={"q": "x" * 1000}, timeout=30)
            assert ok.status_code == 200


@pytest.mark.integration
async def test_two_authorization_values_are_refused_on_both_fronts(
    passthrough_backend: Any, tmp_path: Path
) -> None:
    import grpc

    from gateway.app import create_app
    from schemas.proto import tfs_pb2
    from tests.gateway.conftest import passthrough_models

    tokens = tmp_path / "tokens"
    tokens.write_text("good-token\n")
    port = free_port()
    settings = GatewaySettings(
        models=passthrough_models(passthrough_backend.target),
        grpc_port=port,
        auth={"tokens_file": str(tokens)},
    )
    app = create_app(settings)
    good = ("authorization", "Bearer good-token")
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            body = b'{"instances": [1.0]}'
            assert (
                await client.post("/v1/models/half:predict", content=body, headers=[good])
            ).status_code == 200
            for second in (good, ("authorization", "Bearer other")):
                r = await client.post("/v1/models/half:predict", content=body, headers=[good, second])
                assert r.status_code == 401 and "2 Authorization values" in r.json()["error"], r.text
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(
                "/tensorflow.serving.ModelService/GetModelStatus",
                request_serializer=tfs_pb2.GetModelStatusRequest.SerializeToString,
                response_deserializer=tfs_pb2.GetModelStatusResponse.FromString,
            )
            req = tfs_pb2.GetModelStatusRequest(model_spec=tfs_pb2.ModelSpec(name="half"))
            assert (await call(req, timeout=30, metadata=(good,))).model_version_status
            for second in (good, ("authorization", "Bearer other")):
                with pytest.raises(grpc.aio.AioRpcError) as exc:
                    await call(req, timeout=30, metadata=(good, second))
                assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "2 Authorization values" in (exc.value.details() or "")


async def test_the_ops_port_bounds_the_request_line_too() -> None:
    from gateway.app import create_app

    app = create_app(GatewaySettings(models=_MODELS, ops_port=free_port()))
    ops = httpx.ASGITransport(app=app.state.ops_app)
    async with httpx.AsyncClient(transport=ops, base_url="http://ops") as client:
        assert (await client.get("/healthz", params={"q": "x" * 8_000})).status_code == 200
        r = await client.get("/healthz", params={"q": "x" * 17_000})
        assert r.status_code == 414 and "limits.max_header_bytes" in r.json()["error"]
        r = await client.get("/healthz", headers={f"x-h{i}": "1" for i in range(101)})
        assert r.status_code == 431 and "limits.max_headers" in r.json()["error"]
