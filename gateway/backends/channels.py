"""One ``grpc.aio`` channel per backend target, with keepalive and raised message-size limits.

Channels must be opened inside the running event loop (the app lifespan does it) and closed there.
"""

from __future__ import annotations

import grpc

from schemas.gateway_settings import GrpcSettings

__all__ = ["channel_options", "open_channel"]


def channel_options(cfg: GrpcSettings) -> list[tuple[str, int]]:
    return [
        ("grpc.keepalive_time_ms", int(cfg.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(cfg.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_receive_message_length", cfg.max_receive_message_bytes),
        ("grpc.max_send_message_length", cfg.max_send_message_bytes),
        ("grpc.enable_retries", 1),
    ]


def open_channel(target: str, cfg: GrpcSettings) -> grpc.aio.Channel:
    """An insecure aio channel to ``host:port`` (connects lazily; the first call or readiness probe connects)."""
    return grpc.aio.insecure_channel(target, options=channel_options(cfg))
