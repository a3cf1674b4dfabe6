"""tfs_grpc.channels: the one channel/stub factory of the gateway and the updater, against a real gRPC server
on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from schemas.proto import tfs_pb2
from schemas.tls import BackendTLS
from tests.support.ports import free_port
from tfs_grpc.channels import METHODS, ChannelConfig, channel_options, open_channel, stub


def test_options_follow_the_config() -> None:
    opts = dict(channel_options(ChannelConfig(reconnect_backoff_ms=100, max_reconnect_backoff_ms=1000)))
    assert opts["grpc.initial_reconnect_backoff_ms"] == 100 and opts["grpc.max_reconnect_backoff_ms"] == 1000
    assert opts["grpc.max_send_message_length"] == 64 * 1024 * 1024
    assert "grpc.keepalive_time_ms" not in opts and "grpc.enable_retries" not in opts
    opts = dict(
        channel_options(ChannelConfig(keepalive_time_s=30, keepalive_timeout_s=10, enable_retries=True))
    )
    assert opts["grpc.keepalive_time_ms"] == 30_000 and opts["grpc.keepalive_timeout_ms"] == 10_000
    assert opts["grpc.enable_retries"] == 1 and "grpc.initial_reconnect_backoff_ms" not in opts


def test_tls_server_name_overrides_the_checked_name() -> None:
    tls = BackendTLS(server_name="ps.internal")
    assert ("grpc.ssl_target_name_override", "ps.internal") in channel_options(ChannelConfig(), tls)
    assert all(k != "grpc.ssl_target_name_override" for k, _ in channel_options(ChannelConfig()))


@pytest.fixture
async def server() -> AsyncIterator[str]:
    srv = grpc.aio.server()
    path, request, response = METHODS["Predict"]
    service, method = path.strip("/").split("/")

    async def predict(req: tfs_pb2.PredictRequest, ctx: grpc.aio.ServicerContext) -> tfs_pb2.PredictResponse:
        return tfs_pb2.PredictResponse(model_spec=req.model_spec)

    handler = grpc.unary_unary_rpc_method_handler(
        predict, request_deserializer=request.FromString, response_serializer=response.SerializeToString
    )
    srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
    port = free_port()
    srv.add_insecure_port(f"127.0.0.1:{port}")
    await srv.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await srv.stop(None)


async def test_stubs_call_predict_with_messages_or_serialized_bytes(server: str) -> None:
    channel = open_channel(server, ChannelConfig())
    try:
        req = tfs_pb2.PredictRequest(model_spec=tfs_pb2.ModelSpec(name="m", signature_name="s"))
        typed = await stub(channel, "Predict")(req, timeout=10)
        raw = await stub(channel, "Predict", serialized=True)(req.SerializeToString(), timeout=10)
        assert typed.model_spec.name == raw.model_spec.name == "m"
        assert isinstance(raw, tfs_pb2.PredictResponse)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub(channel, "Classify")(tfs_pb2.ClassificationRequest(), timeout=10)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        await channel.close()
