"""Errors the gateway answers with; every one carries a gRPC status code, mapped to HTTP in exactly one place.

::

    GatewayError (code=UNKNOWN)                    -> {"error": message}, HTTP from HTTP_STATUS[code]
     ├── InvalidArgument      INVALID_ARGUMENT     bad JSON, bad feature value, unknown label ...
     ├── NotFound             NOT_FOUND            unknown model / version / route, PS servables
     ├── FailedPrecondition   FAILED_PRECONDITION  e.g. unknown signature on a backend
     ├── Unimplemented        UNIMPLEMENTED        dtype we cannot encode
     ├── DeadlineExceeded     DEADLINE_EXCEEDED    backend call passed the request deadline (504)
     ├── ResourceExhausted    RESOURCE_EXHAUSTED   too many requests in flight (429, retriable)
     ├── Unavailable          UNAVAILABLE          backend down / overloaded (503, retriable)
     └── Internal             INTERNAL             our bug or a backend answer we cannot read

Messages name what was wrong: feature, example index, input name. ``BackendError`` translation from grpc errors lives
in ``gateway/backends``; this module has no grpc import so pure codecs can raise these errors.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar

__all__ = [
    "Code",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GatewayError",
    "HTTP_STATUS",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "ResourceExhausted",
    "Unavailable",
    "Unimplemented",
    "http_status",
]


class Code(IntEnum):
    """Canonical status codes (same numbers as grpc.StatusCode and tensorflow.error.Code)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# TF Serving's model_servers/http_server.cc ToHTTPStatusCode.
HTTP_STATUS: dict[Code, int] = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.UNAUTHENTICATED: 401,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
}


def http_status(code: Code | int) -> int:
    try:
        return HTTP_STATUS[Code(code)]
    except ValueError:
        return 500


class GatewayError(Exception):
    """Base of every error the gateway turns into a TF Serving style ``{"error": ...}`` response."""

    code: ClassVar[Code] = Code.UNKNOWN
    retriable: ClassVar[bool] = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    @property
    def http_status(self) -> int:
        return http_status(self.code)


class InvalidArgument(GatewayError):
    code = Code.INVALID_ARGUMENT


class NotFound(GatewayError):
    code = Code.NOT_FOUND


class FailedPrecondition(GatewayError):
    code = Code.FAILED_PRECONDITION


class Unimplemented(GatewayError):
    code = Code.UNIMPLEMENTED


class DeadlineExceeded(GatewayError):
    code = Code.DEADLINE_EXCEEDED


class ResourceExhausted(GatewayError):
    code = Code.RESOURCE_EXHAUSTED
    retriable = True


class Unavailable(GatewayError):
    code = Code.UNAVAILABLE
    retriable = True


class Internal(GatewayError):
    code = Code.INTERNAL
