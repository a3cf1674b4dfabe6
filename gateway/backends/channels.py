"""The gateway's backend channels: :mod:`tfs_grpc.channels` configured from the ``grpc`` settings.

One ``grpc.aio`` channel per backend target, with keepalive, gRPC retries and the configured message-size limits,
plain or TLS. Channels must be opened inside the running event loop (the app lifespan does it) and closed there. With
``backend_tls`` set, every channel is a TLS channel built from :func:`channel_credentials` (the CA to verify backends
and, for servers that verify clients, the gateway's client certificate); ``server_name`` overrides the name checked
in the backends' certificates (``grpc.ssl_target_name_override``).
"""

from __future__ import annotations

import grpc

from schemas.gateway_settings import GrpcSettings
from schemas.tls import BackendTLS
from tfs_grpc import channels as tfs
from tfs_grpc.channels import channel_credentials

__all__ = ["channel_config", "channel_credentials", "open_channel"]


def channel_config(cfg: GrpcSettings) -> tfs.ChannelConfig:
    return tfs.ChannelConfig(
        max_send_message_bytes=cfg.max_send_message_bytes,
        max_receive_message_bytes=cfg.max_receive_message_bytes,
        keepalive_time_s=cfg.keepalive_time_s,
        keepalive_timeout_s=cfg.keepalive_timeout_s,
        max_reconnect_backoff_ms=round(cfg.max_reconnect_backoff_s * 1000),
        enable_retries=True,
    )


def open_channel(
    target: str,
    cfg: GrpcSettings,
    tls: BackendTLS | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.aio.Channel:
    """An aio channel to ``host:port``: insecure when ``tls`` is None, else TLS with ``credentials`` (built once
    by the caller with :func:`channel_credentials`, or here). Connects lazily (first call or readiness probe)."""
    return tfs.open_channel(target, channel_config(cfg), tls, credentials)
