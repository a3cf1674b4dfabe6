"""Errors of the updater; ``retriable`` says whether the same work may succeed later.

::

    UpdaterError (retriable=False)
     ├── ConfigError          bad settings, unreadable manifest (startup only)
     └── ApplyError           a PS write failed on one replica; carries the gRPC ``code`` and the ``target``
          ├── ShardUnavailable     UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, CANCELLED,
          │                        NOT_FOUND (servable not loaded yet), UNKNOWN, INTERNAL   retriable=True
          └── ApplyRejected        INVALID_ARGUMENT, FAILED_PRECONDITION, UNIMPLEMENTED, ...  retriable=False

A retriable error pauses the affected Kafka partitions and is retried with exponential backoff, never dropped; a
rejected write sends the messages behind it to the dead-letter topic (reason ``apply_rejected``). Decoding problems
are :class:`schemas.deltas.DeltaError` (dead-lettered with their ``reason``). :func:`error_from_grpc` is the one
place grpc status codes are translated.
"""

from __future__ import annotations

from typing import ClassVar

import grpc

__all__ = [
    "ApplyError",
    "ApplyRejected",
    "ConfigError",
    "ShardUnavailable",
    "UpdaterError",
    "error_from_grpc",
]


class UpdaterError(Exception):
    """Base of every updater error."""

    retriable: ClassVar[bool] = False


class ConfigError(UpdaterError):
    """Invalid settings or manifest; raised at startup, never while consuming."""


class ApplyError(UpdaterError):
    """A write to one PS replica failed; ``target`` is its host:port, ``code`` the gRPC status code."""

    def __init__(self, message: str, *, target: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.target = target
        self.code = code


class ShardUnavailable(ApplyError):
    """The replica is down, restarting, overloaded or too slow: retry later."""

    retriable: ClassVar[bool] = True


class ApplyRejected(ApplyError):
    """The replica refused the write itself: retrying the same bytes would fail again."""


_RETRIABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)


def error_from_grpc(exc: grpc.RpcError, *, target: str, what: str) -> ApplyError:
    """Translate a grpc error from ``target`` while doing ``what`` (e.g. "upsert_item on demo_ps_0")."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    cls = ShardUnavailable if code in _RETRIABLE else ApplyRejected
    return cls(f"{what} at {target} failed: {code.name}: {details}", target=target, code=code)
