"""How the gateway and the updater reach a TF Serving gRPC server: channel options, TLS credentials, channels and
method stubs, in one place.

:func:`open_channel` opens a ``grpc.aio`` channel to ``host:port`` with :class:`ChannelConfig`'s options (message
size limits, keepalive, reconnect backoff, retries), insecure, or TLS when ``tls`` (the settings' ``backend_tls``,
:class:`schemas.tls.BackendTLS`) is given: the CA that verifies servers, an optional client certificate, and
``server_name`` overriding the name checked in the servers' certificates (``grpc.ssl_target_name_override``). Channels
connect lazily and must be opened and closed inside the running event loop. :func:`stub` makes the callable of one
TF Serving method (:data:`METHODS`) on a channel; with ``serialized=True`` it takes requests already serialized to
bytes (the updater serializes a write once for every replica). Errors are gRPC's own (``grpc.aio.AioRpcError``) and
:class:`schemas.tls.TLSFileError` for a bad PEM file: each side maps them (the gateway in
:mod:`gateway.backends.errors`, the updater in :mod:`updater.errors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from schemas.proto import tfs_pb2
from schemas.tls import BackendTLS

__all__ = ["METHODS", "ChannelConfig", "channel_credentials", "channel_options", "open_channel", "stub"]

_PS = "/tensorflow.serving.PredictionService/"

METHODS: dict[str, tuple[str, Any, Any]] = {
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
"""Method name -> (gRPC path, request message class, response message class)."""


@dataclass(frozen=True)
class ChannelConfig:
    """Options of a channel; None leaves gRPC's default. Sizes in bytes, times in seconds or milliseconds as named.

    ``max_reconnect_backoff_ms`` caps how long a channel waits before reconnecting to a server that went away
    (gRPC's default grows to 120 s; a restarted PS must be found again quickly); ``reconnect_backoff_ms`` is the
    first and shortest wait."""

    max_send_message_bytes: int = 64 * 1024 * 1024
    max_receive_message_bytes: int = 64 * 1024 * 1024
    keepalive_time_s: float | None = None
    keepalive_timeout_s: float | None = None
    reconnect_backoff_ms: int | None = None
    max_reconnect_backoff_ms: int | None = None
    enable_retries: bool | None = None


def channel_options(config: ChannelConfig, tls: BackendTLS | None = None) -> list[tuple[str, int | str]]:
    """The ``grpc.*`` channel arguments for ``config`` (and ``tls.server_name``)."""
    options: list[tuple[str, int | str]] = []
    if config.keepalive_time_s is not None:
        options += [
            ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    if config.keepalive_timeout_s is not None:
        options.append(("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)))
    options += [
        ("grpc.max_receive_message_length", config.max_receive_message_bytes),
        ("grpc.max_send_message_length", config.max_send_message_bytes),
    ]
    if config.reconnect_backoff_ms is not None:
        options += [
            ("grpc.initial_reconnect_backoff_ms", config.reconnect_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", config.reconnect_backoff_ms),
        ]
    if config.max_reconnect_backoff_ms is not None:
        options.append(("grpc.max_reconnect_backoff_ms", config.max_reconnect_backoff_ms))
    if config.enable_retries is not None:
        options.append(("grpc.enable_retries", int(config.enable_retries)))
    if tls is not None and tls.server_name is not None:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def channel_credentials(tls: BackendTLS) -> grpc.ChannelCredentials:
    """TLS credentials from ``tls``'s PEM files, read now (``schemas.tls.TLSFileError`` names a bad file)."""
    pem = tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=pem.root_certificates,
        private_key=pem.private_key,
        certificate_chain=pem.certificate_chain,
    )


def open_channel(
    target: str,
    config: ChannelConfig,
    tls: BackendTLS | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.aio.Channel:
    """An aio channel to ``host:port``: insecure when ``tls`` is None, else TLS with ``credentials`` (built once by
    the caller with :func:`channel_credentials` and shared by its channels, or here)."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=channel_options(config))
    creds = credentials if credentials is not None else channel_credentials(tls)
    return grpc.aio.secure_channel(target, creds, options=channel_options(config, tls))


def stub(
    channel: grpc.aio.Channel, method: str, *, serialized: bool = False, serialized_response: bool = False
) -> grpc.aio.UnaryUnaryMultiCallable:
    """The callable of ``method`` (a key of :data:`METHODS`) on ``channel``; responses are parsed messages. With
    ``serialized`` the callable takes the request as bytes instead of a message; with ``serialized_response`` it
    returns the response's bytes unparsed."""
    path, request, response = METHODS[method]
    return channel.unary_unary(
        path,
        request_serializer=None if serialized else request.SerializeToString,
        response_deserializer=None if serialized_response else response.FromString,
    )
