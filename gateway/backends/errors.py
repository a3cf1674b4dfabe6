"""The one place grpc errors become GatewayErrors (``raise ... from exc``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from gateway.errors import Code, GatewayError, error_for_code

__all__ = ["error_from_rpc", "map_grpc_errors"]


def error_from_rpc(exc: grpc.RpcError) -> GatewayError:
    """The GatewayError with the same canonical code and the backend's details as message."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else None
    num = code.value[0] if isinstance(code, grpc.StatusCode) else int(Code.UNKNOWN)
    if num == Code.OK:
        num = Code.UNKNOWN
    message = details or (code.name if isinstance(code, grpc.StatusCode) else "backend error")
    return error_for_code(num, message)


@contextmanager
def map_grpc_errors() -> Iterator[None]:
    """Translate any ``grpc.RpcError`` raised inside the block."""
    try:
        yield
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from exc
