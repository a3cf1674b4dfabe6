"""Health that cannot be flooded (issue 21 item 3): ``/readyz`` and gRPC ``Health`` answer from the gateway's own
readiness poller, and tell models apart only to callers with a token.

Real parts: serve-local backends, the gateway as a process (REST + gRPC) or in process with its lifespan. Probes are
counted from the gateway's own count of backend ``GetModelStatus`` calls (``embedgate_backend_call_duration_seconds``,
observed by the backend client for every call, whoever makes it)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from schemas.gateway_settings import GatewaySettings
from tests.support.gateway import run_gateway
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

_POLL_S = 1.0
_FLOOD = 2000  # /readyz requests, and as many Health.Check calls, all at once
_STATUS_COUNT = re.compile(
    r'^embedgate_backend_call_duration_seconds_count\{method="GetModelStatus",target="([^"]+)"\} (\S+)$', re.M
)


def _probes(url: str) -> dict[str, float]:
    """GetModelStatus calls the gateway made so far, per target."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {t: float(n) for t, n in _STATUS_COUNT.findall(text)}


async def _flood(url: str, grpc_port: int) -> tuple[list[int], list[int]]:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    limits = httpx.Limits(max_connections=64)
    async with (
        httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http,
        grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        gate = asyncio.Semaphore(256)

        async def ready() -> int:
            async with gate:
                return (await http.get("/readyz")).status_code

        async def check(service: str) -> int:
            async with gate:
                return int(
                    (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=120)).status
                )

        services = ("", "tensorflow.serving.PredictionService", "half", "multi")
        results = await asyncio.gather(
            *(ready() for _ in range(_FLOOD)), *(check(services[i % 4]) for i in range(_FLOOD))
        )
    return list(results[:_FLOOD]), list(results[_FLOOD:])


def _wait_status(url: str, status: int, *, attempts: int = 600) -> dict[str, Any]:
    """/readyz until it answers ``status`` (bounded by ``attempts`` x 0.1 s, not a timing claim)."""
    for _ in range(attempts):
        r = httpx.get(f"{url}/readyz", timeout=30)
        if r.status_code == status:
            return dict(r.json())
        time.sleep(0.1)
    pytest.fail(f"/readyz never answered {status}")


def test_a_flood_of_health_calls_makes_one_probe_per_backend_per_poll(
    passthrough_backend: Any, tf_models: dict[str, Path], tmp_path: Path
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tests.support.servers import serve_local

    serving = health_pb2.HealthCheckResponse.SERVING
    with serve_local({"half": tf_models["half"]}) as own:
        models = [
            {"kind": "passthrough", "name": "half", "target": own.target},
            {"kind": "passthrough", "name": "multi", "target": passthrough_backend.target},
        ]
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": models, "health_poll_s": _POLL_S}))
        grpc_port = free_port()
        with run_gateway(cfg, env={"EMBEDGATE_GRPC_PORT": str(grpc_port)}) as gw:
            before, start = _probes(gw.url), time.monotonic()
            rest, health = asyncio.run(_flood(gw.url, grpc_port))
            elapsed, after = time.monotonic() - start, _probes(gw.url)
            assert rest == [200] * _FLOOD  # never flipped
            assert health == [serving] * _FLOOD
            polls = (
                int(elapsed / _POLL_S) + 2
            )  # polls that may have started in the window, counting both ends
            for target in (own.target, passthrough_backend.target):  # one servable per target here
                made = after.get(target, 0) - before.get(target, 0)
                assert made <= polls, (target, made, polls, elapsed)
            # the backend goes down for real: the next poll sees it; probes stay as rare
            own.proc.terminate()
            own.proc.wait(timeout=30)
            doc = _wait_status(gw.url, 503)
            assert doc["status"] == "not ready" and doc["models"]["multi"] == "ok"
            assert doc["models"]["half"].startswith("UNAVAILABLE") and own.target not in doc["models"]["half"]
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                check = stub.Check
                for service, want in (("", False), ("half", False), ("multi", True)):
                    got = check(health_pb2.HealthCheckRequest(service=service), timeout=30).status
                    assert (got == serving) is want, service


@pytest.mark.parametrize("ops_port", [False, True])
async def test_readyz_tells_models_only_to_token_holders(
    passthrough_backend: Any, tmp_path: Path, ops_port: bool
) -> None:
    from gateway.app import create_app
    from tests.gateway.conftest import passthrough_models

    tokens = tmp_path / "tokens"
    tokens.write_text("full-token\nhalf-token half\n")
    settings = GatewaySettings(
        models=passthrough_models(passthrough_backend.target),
        auth={"tokens_file": str(tokens)},
        ops_port=free_port() if ops_port else None,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for headers in ({}, {"authorization": "Bearer wrong"}):
                r = await client.get("/readyz", headers=headers)
                assert r.status_code == 200 and r.json() == {"status": "ready"}, r.text
            r = await client.get("/readyz", headers={"authorization": "Bearer half-token"})
            assert r.json() == (
                {"status": "ready"} if ops_port else {"status": "ready", "models": {"half": "ok"}}
            )
            r = await client.get("/readyz", headers={"authorization": "Bearer full-token"})
            if not ops_port:
                assert set(r.json()["models"]) == {"half", "multi", "slow", "cr", "renamed"}
        if ops_port:  # the ops port shows every detail (restricted by network, not by tokens)
            ops = httpx.ASGITransport(app=app.state.ops_app)
            async with httpx.AsyncClient(transport=ops, base_url="http://ops") as client:
                r = await client.get("/readyz")
                assert set(r.json()["models"]) == {"half", "multi", "slow", "cr", "renamed"}


async def test_health_check_of_a_model_needs_a_token_and_never_tells_whether_it_exists(
    passthrough_backend: Any, tmp_path: Path
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from gateway.app import create_app
    from tests.gateway.conftest import passthrough_models

    tokens = tmp_path / "tokens"
    tokens.write_text("full-token\nhalf-token half\n")
    port = free_port()
    settings = GatewaySettings(
        models=passthrough_models(passthrough_backend.target),
        grpc_port=port,
        auth={"tokens_file": str(tokens)},
    )
    app = create_app(settings)
    serving = health_pb2.HealthCheckResponse.SERVING
    code = grpc.StatusCode
    async with app.router.lifespan_context(app), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def check(service: str, token: str | None) -> int | grpc.StatusCode:
            md = (("authorization", f"Bearer {token}"),) if token else None
            try:
                return int(
                    (
                        await stub.Check(
                            health_pb2.HealthCheckRequest(service=service), timeout=30, metadata=md
                        )
                    ).status
                )
            except grpc.aio.AioRpcError as exc:
                return exc.code()

        for service in ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"):
            assert await check(service, None) == serving  # the overall status: open
        for token, known, unknown, want in (
            (None, "half", "no-such-model", code.UNAUTHENTICATED),
            ("wrong", "half", "no-such-model", code.UNAUTHENTICATED),
            ("half-token", "multi", "no-such-model", code.PERMISSION_DENIED),
        ):  # an existing and a made-up model get the same answer
            assert await check(known, token) == want == await check(unknown, token), token
        assert await check("half", "half-token") == serving
        assert await check("multi", "full-token") == serving
        assert await check("no-such-model", "full-token") == code.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="half"), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            async for _ in watch:
                pass
        assert exc.value.code() == code.UNAUTHENTICATED
        md = (("authorization", "Bearer full-token"), ("authorization", "Bearer full-token"))
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.Check(health_pb2.HealthCheckRequest(service="half"), timeout=30, metadata=md)
        assert exc.value.code() == code.UNAUTHENTICATED and "2 Authorization values" in (
            exc.value.details() or ""
        )
