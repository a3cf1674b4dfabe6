"""The event loop the gateway runs on (``event_loop``): the gateway core, REST and the gRPC front work on uvloop too."""

from __future__ import annotations

import asyncio
from typing import Literal

import grpc
import httpx
import pytest
import uvloop

from gateway.app import create_app
from gateway.servers import loop_factory
from schemas.deployment import PassthroughModel
from schemas.gateway_settings import GatewaySettings
from schemas.proto import tfs_pb2
from tests.gateway.fake_backend import FakeBackend, fake_backend
from tests.support.ports import free_port

_WAIT_S = 60.0  # bound of every call (never reached when the gateway behaves)
_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"


def _settings(target: str, event_loop: Literal["asyncio", "uvloop"]) -> GatewaySettings:
    return GatewaySettings(
        models=[PassthroughModel(name="m", target=target)],
        host="127.0.0.1",
        grpc_port=free_port(),
        event_loop=event_loop,
    )


def test_loop_factory_makes_the_configured_loop() -> None:
    loop = loop_factory(_settings("127.0.0.1:1", "uvloop"))()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    loop = loop_factory(_settings("127.0.0.1:1", "asyncio"))()
    try:
        assert not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def _grpc_metadata(target: str) -> tfs_pb2.GetModelMetadataResponse:
    """A GetModelMetadata call from a plain (threaded) gRPC client."""
    req = tfs_pb2.GetModelMetadataRequest(
        model_spec=tfs_pb2.ModelSpec(name="m"), metadata_field=["signature_def"]
    )
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            _METADATA,
            request_serializer=tfs_pb2.GetModelMetadataRequest.SerializeToString,
            response_deserializer=tfs_pb2.GetModelMetadataResponse.FromString,
        )
        resp: tfs_pb2.GetModelMetadataResponse = call(req, timeout=_WAIT_S)
        return resp


async def _both_fronts(settings: GatewaySettings) -> tuple[type[asyncio.AbstractEventLoop], int, str]:
    """The lifespan run on the current loop; one REST and one gRPC call relayed to the backend (the gateway's
    backend channels live on this loop, the gRPC front on its own asyncio loop)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=_WAIT_S) as client:
            rest = await client.get("/v1/models/m/metadata")
        target = f"127.0.0.1:{app.state.runtime.grpc_port}"
        over_grpc = await asyncio.to_thread(_grpc_metadata, target)
        return type(asyncio.get_running_loop()), rest.status_code, over_grpc.model_spec.name


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_both_fronts_answer_on_the_configured_loop(event_loop: Literal["asyncio", "uvloop"]) -> None:
    backend: FakeBackend
    with fake_backend() as backend:
        settings = _settings(backend.target, event_loop)
        with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
            kind, rest_status, grpc_name = runner.run(_both_fronts(settings))
    assert issubclass(kind, uvloop.Loop) == (event_loop == "uvloop")
    assert rest_status == 200
    assert grpc_name == "m"
