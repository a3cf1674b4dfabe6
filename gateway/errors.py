"""Errors the gateway answers with; every one carries a gRPC status code, mapped to HTTP in exactly one place.

::

    GatewayError (code=UNKNOWN)                    -> {"error": message}, HTTP from HTTP_STATUS[code]
     ├── InvalidArgument      INVALID_ARGUMENT     bad JSON, bad feature value, unknown label ...
     ├── NotFound             NOT_FOUND            unknown model / version / route, PS servables
     ├── FailedPrecondition   FAILED_PRECONDITION  e.g. unknown signature on a backend
     ├── Unimplemented        UNIMPLEMENTED        dtype we cannot encode
     ├── DeadlineExceeded     DEADLINE_EXCEEDED    backend call passed the request deadline (504)
     ├── ResourceExhausted    RESOURCE_EXHAUSTED   too many requests in flight / bytes buffered (429, retriable)
     ├── PayloadTooLarge      RESOURCE_EXHAUSTED   a request over a count limit (HTTP 413, not retriable)
     ├── RequestTimeout       DEADLINE_EXCEEDED    the body did not arrive within limits.body_timeout_s (HTTP 408)
     ├── HeadersTooLarge      INVALID_ARGUMENT     too many / too large headers (HTTP 431)
     ├── Unavailable          UNAVAILABLE          backend down / overloaded (503, retriable)
     ├── Internal             INTERNAL             our bug or a backend answer we cannot read
     └── (relayed backend codes) Cancelled, AlreadyExists, PermissionDenied, Aborted, OutOfRange, DataLoss,
                                 Unauthenticated: only produced by ``error_for_code`` from a backend status

A class may set ``http_override`` when HTTP has a more precise status than the code's (413, 408, 431); gRPC fronts
use ``code``. Client-facing texts go through :func:`public_message`, which removes backend addresses and bounds the
length (:data:`MAX_MESSAGE_CHARS`) in linear time; client-controlled parts of a message (model, signature, label,
feature and input names, paths) are cut with :func:`clip` (:data:`CLIENT_TEXT_CHARS`) where the message is made.

Messages name what was wrong: feature, example index, input name. ``BackendError`` translation from grpc errors lives
in ``gateway/backends``; this module has no grpc import so pure codecs can raise these errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import IntEnum
from typing import ClassVar, Final

__all__ = [
    "CLIENT_TEXT_CHARS",
    "HTTP_STATUS",
    "MAX_MESSAGE_CHARS",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "Code",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GatewayError",
    "HeadersTooLarge",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PayloadTooLarge",
    "PermissionDenied",
    "RequestTimeout",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "clip",
    "error_for_code",
    "http_status",
    "public_message",
    "status_string",
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
    http_override: ClassVar[int | None] = None

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    @property
    def http_status(self) -> int:
        return self.http_override if self.http_override is not None else http_status(self.code)


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


class PayloadTooLarge(GatewayError):
    code = Code.RESOURCE_EXHAUSTED
    http_override = 413


class RequestTimeout(GatewayError):
    code = Code.DEADLINE_EXCEEDED
    http_override = 408


class HeadersTooLarge(GatewayError):
    code = Code.INVALID_ARGUMENT
    http_override = 431


class Unavailable(GatewayError):
    code = Code.UNAVAILABLE
    retriable = True


class Internal(GatewayError):
    code = Code.INTERNAL


class Cancelled(GatewayError):
    code = Code.CANCELLED


class AlreadyExists(GatewayError):
    code = Code.ALREADY_EXISTS


class PermissionDenied(GatewayError):
    code = Code.PERMISSION_DENIED


class Aborted(GatewayError):
    code = Code.ABORTED


class OutOfRange(GatewayError):
    code = Code.OUT_OF_RANGE


class DataLoss(GatewayError):
    code = Code.DATA_LOSS


class Unauthenticated(GatewayError):
    code = Code.UNAUTHENTICATED


_BY_CODE: dict[Code, type[GatewayError]] = {
    Code.CANCELLED: Cancelled,
    Code.UNKNOWN: GatewayError,
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.DEADLINE_EXCEEDED: DeadlineExceeded,
    Code.NOT_FOUND: NotFound,
    Code.ALREADY_EXISTS: AlreadyExists,
    Code.PERMISSION_DENIED: PermissionDenied,
    Code.RESOURCE_EXHAUSTED: ResourceExhausted,
    Code.FAILED_PRECONDITION: FailedPrecondition,
    Code.ABORTED: Aborted,
    Code.OUT_OF_RANGE: OutOfRange,
    Code.UNIMPLEMENTED: Unimplemented,
    Code.INTERNAL: Internal,
    Code.UNAVAILABLE: Unavailable,
    Code.DATA_LOSS: DataLoss,
    Code.UNAUTHENTICATED: Unauthenticated,
}


def error_for_code(code: Code | int, message: str) -> GatewayError:
    """The GatewayError subclass carrying ``code`` (OK and unknown numbers become UNKNOWN -> 500)."""
    try:
        cls = _BY_CODE.get(Code(code), GatewayError)
    except ValueError:
        cls = GatewayError
    return cls(message)


def status_string(err: GatewayError) -> str:
    """``CODE_NAME: message``, the way TF Serving prints a wrapped ``Status`` (``status.ToString()``)."""
    return f"{err.code.name}: {err.message}"


# ---- client-facing texts ---------------------------------------------------------------------------------------

CLIENT_TEXT_CHARS: Final = 256
"""A client-controlled part echoed in an error (model name, signature, label, feature or input name, path) is cut to
this many characters by :func:`clip`."""
MAX_MESSAGE_CHARS: Final = 16384
""":func:`public_message` cuts any message to this many characters (a bound for texts no :func:`clip` shortened)."""
MAX_NAME_BYTES: Final = 4096
"""The longest model name, signature name or version label a request may carry, in UTF-8 bytes. No servable has a
longer one, so a longer one is refused (:func:`name_too_long`) before its text is copied, decoded or echoed."""
_HIDDEN: Final = "<backend>"

# One token per match, left to right; every alternative is deterministic (no nested or overlapping repetition), so a
# failed attempt at a position costs at most the run of characters after it that one class accepts, and every
# character is consumed by at most a constant number of attempts: ``sub`` runs in time linear in the text. A gRPC
# scheme prefix (``ipv4:``, ``dns:///``, ...) is matched with the address that follows it.
_TOKEN: Final = re.compile(
    r"(?P<unix>\b(?:unix-abstract:|unix:/)\S*)"
    r"|(?P<scheme>(?:ipv4|ipv6|dns):(?://?/?)?)?"
    r"(?:(?P<bracket>\[[0-9A-Fa-f.:]*(?:%[\w.-]+)?\])|(?P<run>[A-Za-z0-9_.-]+))"
    r"(?P<port>:\d{1,5}(?!\w))?"
)
_EDGE: Final = "._-"


def clip(text: str, limit: int = CLIENT_TEXT_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit`` characters, ``...`` and the
    original length: ``aaaa... (1048576 chars)``. For client-controlled parts of error messages; O(limit)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def name_too_long(field: str, size: int) -> InvalidArgument:
    """The error for a name of ``size`` UTF-8 bytes, over :data:`MAX_NAME_BYTES` (``field`` as the request spells
    it: ``signature_name``, ``model_spec.name`` ...)."""
    return InvalidArgument(
        f"{field} is {size:,} bytes long; at most {MAX_NAME_BYTES:,} (no model, signature or version label served "
        "has a longer one)"
    )


def checked_name(field: str, text: str) -> str:
    """``text`` when it has at most :data:`MAX_NAME_BYTES` UTF-8 bytes, else InvalidArgument (:func:`name_too_long`).
    O(1) for short or ASCII text."""
    if len(text) <= MAX_NAME_BYTES // 4:  # a character takes at most 4 bytes
        return text
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise name_too_long(field, size)
    return text


def _is_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(0 < len(p) <= 3 and p.isascii() and p.isdigit() for p in parts)


def _address(m: re.Match[str]) -> str:
    """The replacement of one token: ``<backend>`` for an address (keeping a run's leading/trailing ``._-``), else
    the token unchanged."""
    if m.group("unix") is not None:
        return _HIDDEN
    bracket, port = m.group("bracket"), m.group("port")
    if bracket is not None:
        return _HIDDEN if ":" in bracket else m.group(0)
    run: str = m.group("run")
    host = run.strip(_EDGE)
    is_host = host[:1].isalnum() and "." in host and (port is not None or _is_ipv4(host))
    if not is_host:
        return m.group(0)
    lead = run[: len(run) - len(run.lstrip(_EDGE))]
    trail = "" if port is not None else run[len(lead) + len(host) :]
    return f"{lead}{_HIDDEN}{trail}"


def _scrub(message: str, targets: Iterable[str]) -> str:
    """``message`` with backend addresses replaced; linear in ``len(message)`` (times the targets' lengths)."""
    message = _TOKEN.sub(_address, message)
    for t in sorted(targets, key=len, reverse=True):
        if t and t in message:
            message = message.replace(t, _HIDDEN)
    for t in targets:
        host = t.rsplit(":", 1)[0]
        if len(host) > 2 and host in message:  # a literal with fixed-width lookarounds: linear
            message = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", _HIDDEN, message)
    return message


def public_message(message: str, targets: Iterable[str] = ()) -> str:
    """``message`` as a client may see it: without backend addresses and at most about :data:`MAX_MESSAGE_CHARS`.

    Every configured target (``host:port`` as configured, and its host), gRPC address forms (``ipv4:1.2.3.4:8500``,
    ``ipv6:[::1]:8500``, ``unix:/path``), ``host.name:port`` and IPv4 literals become ``<backend>``. A longer message
    is cut first, before the last word that runs across the cut (so no address is left half hidden), and ends with
    ``... (message cut: N chars)``. Time linear in ``min(len(message), MAX_MESSAGE_CHARS)``; never a regex with
    backtracking over the text."""
    size = len(message)
    if size <= MAX_MESSAGE_CHARS:
        return _scrub(message, targets)
    head = message[:MAX_MESSAGE_CHARS]
    if not message[MAX_MESSAGE_CHARS].isspace():  # drop the part of a word that runs across the cut
        parts = head.rsplit(None, 1)
        head = parts[0] if len(parts) == 2 else ""
    return f"{_scrub(head, targets)}... (message cut: {size} chars)"
