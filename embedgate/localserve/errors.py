"""Errors of the local server, each carrying the gRPC status code TF Serving uses for the same failure.

Tree::

    ServingError (code)             base; ``service.py`` turns any of these into ``context.abort(code, message)``
    ├── NotFoundError               NOT_FOUND: unknown model / version ("Servable not found for request: ...")
    ├── InvalidArgumentError        INVALID_ARGUMENT: bad inputs, dtypes, shapes, unknown label, bad output_filter
    ├── FailedPreconditionError     FAILED_PRECONDITION: unknown signature key, signature of the wrong kind
    └── InternalError               INTERNAL: a model that broke while running
    ConfigError                     a model config that cannot be used (startup / reload); not a request error

Messages follow TF Serving's where it has one (``docs/serve-local.md`` lists them).
"""

from __future__ import annotations

import grpc

__all__ = [
    "ConfigError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "ServingError",
]


class ServingError(Exception):
    """A request that failed; ``code`` is the gRPC status code to answer with, ``message`` its details."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFoundError(ServingError):
    code = grpc.StatusCode.NOT_FOUND


class InvalidArgumentError(ServingError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPreconditionError(ServingError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class InternalError(ServingError):
    code = grpc.StatusCode.INTERNAL


class ConfigError(ValueError):
    """A model config file or flag combination that cannot be served; the message names the file and problem."""
