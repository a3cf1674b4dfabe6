"""The one place grpc errors become GatewayErrors (``raise ... from exc``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from gateway.errors import Code, GatewayError, error_for_code

__all__ = ["error_for_status", "error_from_rpc", "map_grpc_errors"]


def error_for_status(code: int, details: str) -> GatewayError:
    """The GatewayError of a backend call that ended with status ``code`` and ``details`` (the message; the code's
    name when empty). OK and unknown numbers are UNKNOWN: a call without an answer did not succeed."""
    try:
        known = Code(code)
    except ValueError:
        known = Code.UNKNOWN
    if known == Code.OK:
        known = Code.UNKNOWN
    return error_for_code(known, details or known.name)


def error_from_rpc(exc: grpc.RpcError) -> GatewayError:
    """The GatewayError with the same canonical code and the backend's details as message."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else None
    if not isinstance(code, grpc.StatusCode):
        return error_for_code(Code.UNKNOWN, details or "backend error")
    return error_for_status(code.value[0], details or code.name)


@contextmanager
def map_grpc_errors() -> Iterator[None]:
    """Translate any ``grpc.RpcError`` raised inside the block."""
    try:
        yield
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from exc
