"""Admission control of a real gateway process driven over its limit by a bounded burst, over REST and gRPC.

The backend (``tests.gateway.fake_backend``) holds GetModelMetadata until released, so the first requests admitted stay
in flight while the rest of the burst arrives: which requests are admitted, queued and shed does not depend on timing.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from schemas.proto import tfs_pb2
from tests.gateway.fake_backend import FakeBackend, call_metadata, fake_backend
from tests.support.gateway import GatewayProc, run_gateway
from tests.support.ports import free_port
from tests.support.stack import metric_sum

pytestmark = pytest.mark.integration

_WAIT_S = 60.0  # bound of every wait (never reached when the gateway behaves)
_BURST = 12
_LIMIT = 2  # max_in_flight (and admission.min_limit): the adaptive limit stays at 2
_QUEUE = 2  # requests that may wait: admission.max_queue (5), but never more than the limit
_AT_ONCE = re.compile(
    r"Too many requests in flight: (\d+) at the concurrency limit of 2 \(max_in_flight=2\), (\d+) waiting "
    r"\(admission\.max_queue\)(?: and (\d+) on their way)?; retry later"
)
_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"


def _metric(gw: GatewayProc, name: str, labels: dict[str, str] | None = None) -> float:
    return metric_sum(httpx.get(f"{gw.url}/metrics", timeout=10).text, name, labels)


def _wait_metric(gw: GatewayProc, name: str, labels: dict[str, str] | None, value: float) -> None:
    deadline = time.monotonic() + _WAIT_S
    while _metric(gw, name, labels) < value:
        if time.monotonic() > deadline:
            pytest.fail(f"{name}{{{labels}}} never reached {value}: {_metric(gw, name, labels)}")
        time.sleep(0.02)


def _config(tmp_path: Path, target: str, grpc_port: int) -> Path:
    config: dict[str, Any] = {
        "models": [
            {"kind": "passthrough", "name": "m", "target": target},
            {"kind": "passthrough", "name": "m2", "target": target},
        ],
        "grpc_port": grpc_port,
        "max_in_flight": _LIMIT,
        "retry_after_s": 2,
        # the loop-lag shedder off: a loaded machine must not add a third reason to the counts checked here
        "admission": {"min_limit": _LIMIT, "max_queue": 5, "queue_timeout_s": 0.5, "max_loop_lag_s": 0},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


async def _rest_burst(url: str) -> list[httpx.Response]:
    body = json.dumps({"instances": [1.0]}).encode()
    async with httpx.AsyncClient(timeout=_WAIT_S, limits=httpx.Limits(max_connections=_BURST)) as client:
        return list(
            await asyncio.gather(
                *(
                    client.post(
                        f"{url}/v1/models/m:predict",
                        content=body,
                        headers={"content-type": "application/json"},
                    )
                    for _ in range(_BURST)
                )
            )
        )


async def _grpc_burst(target: str) -> list[grpc.StatusCode | tuple[grpc.StatusCode, str]]:
    """GetModelMetadata calls (a pass-through Predict over gRPC is forwarded without metadata: it would not be held)."""
    req = tfs_pb2.GetModelMetadataRequest(
        model_spec=tfs_pb2.ModelSpec(name="m2"), metadata_field=["signature_def"]
    )
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(
            _METADATA,
            request_serializer=tfs_pb2.GetModelMetadataRequest.SerializeToString,
            response_deserializer=tfs_pb2.GetModelMetadataResponse.FromString,
        )

        async def one() -> grpc.StatusCode | tuple[grpc.StatusCode, str]:
            try:
                await call(req, timeout=_WAIT_S)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            return grpc.StatusCode.OK

        return list(await asyncio.gather(*(one() for _ in range(_BURST))))


def _release_when_shed(backend: FakeBackend, gw: GatewayProc, shed: float) -> None:
    """Once ``shed`` requests in all were shed (the burst has arrived), let the held requests finish."""
    _wait_metric(gw, "embedgate_admission_shed_total", None, shed)
    backend.release.set()


def test_a_burst_over_the_limit_is_shed_with_clear_answers_and_counted(tmp_path: Path) -> None:
    """2 admitted (held at the backend), 2 queued (shed after 0.5 s), 8 refused at once; REST then gRPC."""
    shed_per_burst = _BURST - _LIMIT
    with fake_backend() as backend:
        backend.hold_metadata = True
        port = free_port()
        with run_gateway(_config(tmp_path, backend.target, port)) as gw:
            assert _metric(gw, "embedgate_admission_limit") == _LIMIT
            loop = asyncio.new_event_loop()
            try:
                burst = loop.create_task(_rest_burst(gw.url))
                loop.run_until_complete(
                    asyncio.gather(burst, asyncio.to_thread(_release_when_shed, backend, gw, shed_per_burst))
                )
                responses = burst.result()
                assert sorted(r.status_code for r in responses) == [200] * _LIMIT + [429] * shed_per_burst
                errors = [r.json()["error"] for r in responses if r.status_code == 429]
                assert all(r.headers["retry-after"] == "2" for r in responses if r.status_code == 429)
                at_once = [e for e in errors if "Too many requests in flight" in e]
                timed_out = [e for e in errors if "admission.queue_timeout_s" in e]
                assert len(at_once) == _BURST - _LIMIT - _QUEUE and len(timed_out) == _QUEUE, errors
                # admission's words, or the REST gate's for requests on their way to admission's full room
                for e in at_once:
                    m = _AT_ONCE.fullmatch(e)
                    assert m is not None, e
                    held, waiting, way = int(m[1]), int(m[2]), int(m[3] or 0)
                    assert (
                        (waiting == _QUEUE) if m[3] is None else (held + waiting + way >= _LIMIT + _QUEUE)
                    ), e

                backend.release.clear()  # m2's metadata is not cached yet: its first calls are held again
                burst2 = loop.create_task(_grpc_burst(f"127.0.0.1:{port}"))
                loop.run_until_complete(
                    asyncio.gather(
                        burst2, asyncio.to_thread(_release_when_shed, backend, gw, 2 * shed_per_burst)
                    )
                )
                codes = burst2.result()
            finally:
                loop.close()
            assert codes.count(grpc.StatusCode.OK) == _LIMIT, codes
            refused = [c for c in codes if c != grpc.StatusCode.OK]
            assert len(refused) == shed_per_burst
            assert all(
                isinstance(c, tuple) and c[0] == grpc.StatusCode.RESOURCE_EXHAUSTED for c in refused
            ), refused
            # every refusal names the bound; the gRPC front may also refuse a call while more than max_in_flight
            # messages are being read (reason receiving), which a loaded machine can make happen in a burst
            grpc_texts = [c[1] for c in refused if isinstance(c, tuple)]
            assert all("retry later" in t and "max_in_flight" in t for t in grpc_texts), grpc_texts
            receiving = sum("being received at once" in t for t in grpc_texts)
            # counted by reason, both fronts together; the wait of every queued request observed
            full = _metric(gw, "embedgate_admission_shed_total", {"reason": "queue_full"})
            timed = _metric(gw, "embedgate_admission_shed_total", {"reason": "queue_timeout"})
            assert _metric(gw, "embedgate_admission_shed_total", {"reason": "receiving"}) == receiving
            # the native gRPC gate refuses a call past the limit plus the queue it relayed before admission saw it
            gate = _metric(gw, "embedgate_admission_shed_total", {"reason": "grpc_gate"})
            rest_gate = _metric(gw, "embedgate_admission_shed_total", {"reason": "rest_gate"})
            assert full + timed + receiving + gate + rest_gate == 2 * shed_per_burst
            assert (
                full + rest_gate >= _BURST - _LIMIT - _QUEUE and timed >= _QUEUE
            )  # REST's alone, checked above
            assert _metric(gw, "embedgate_admission_queue_wait_seconds_count") == timed
            assert _metric(gw, "embedgate_requests_rejected_total") == 2 * shed_per_burst
            # admitted requests after the burst still succeed
            ok = httpx.post(f"{gw.url}/v1/models/m:predict", json={"instances": [1.0]}, timeout=_WAIT_S)
            assert ok.status_code == 200, ok.text


def test_grpc_overload_is_refused_while_the_gateway_loop_is_blocked() -> None:
    """The gRPC front refuses on its own thread: with the only slot held and no queue, a second call is answered
    RESOURCE_EXHAUSTED while the gateway's event loop is blocked (in-process gateway, real gRPC on 127.0.0.1).

    The loop is blocked by joining the thread that makes the second call, so that call can only be answered from the
    gRPC server's own thread; if the refusal needed the gateway's loop, it would end DEADLINE_EXCEEDED instead."""
    from gateway.app import create_app
    from schemas.deployment import PassthroughModel
    from schemas.gateway_settings import GatewaySettings

    result: dict[str, grpc.StatusCode] = {}
    req = tfs_pb2.GetModelMetadataRequest(
        model_spec=tfs_pb2.ModelSpec(name="m"), metadata_field=["signature_def"]
    )

    def second_call(target: str) -> None:
        result["code"] = call_metadata(target)

    async def scenario(backend: FakeBackend) -> None:
        settings = GatewaySettings(
            models=[PassthroughModel(name="m", target=backend.target)],
            host="127.0.0.1",
            grpc_port=free_port(),
            max_in_flight=1,
            admission={"queue_timeout_s": 0, "max_loop_lag_s": 0},
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            target = f"127.0.0.1:{app.state.runtime.grpc_port}"
            async with grpc.aio.insecure_channel(target) as channel:
                first = channel.unary_unary(
                    _METADATA, request_serializer=tfs_pb2.GetModelMetadataRequest.SerializeToString
                )(req, timeout=_WAIT_S)
                assert await asyncio.to_thread(backend.metadata_started.wait, _WAIT_S)
                assert app.state.runtime.limiter.current == 1  # the only slot is held at the backend
                caller = threading.Thread(target=second_call, args=(target,))
                caller.start()
                caller.join(
                    _WAIT_S + 10
                )  # blocks this loop, the gateway's, until the second call has its answer
                backend.release.set()
                await first

    with fake_backend() as backend:
        backend.hold_metadata = True
        asyncio.run(scenario(backend))
    assert result.get("code") == grpc.StatusCode.RESOURCE_EXHAUSTED, result
