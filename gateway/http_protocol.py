"""The gateway's HTTP/1.1 protocol for uvicorn (``limits.http_parser: httptools``, the default).

uvicorn's httptools protocol (llhttp, in C) with two additions:

* **Refusals before the ASGI request.** While admission control would refuse a ``/v1/...`` request anyway
  (:class:`gateway.admission.Shedder`, the same decision and counts as :class:`gateway.admission.ShedMiddleware`),
  the 429 is written as soon as the request's headers are parsed: no ASGI scope, no task, no middleware, and the
  request's body is skipped as it arrives. A refusal so costs the gateway 143-159 µs of CPU against 383-441 µs with
  uvicorn's h11 protocol and the middleware (``python -m benchmarks.refusal_bench``, docs/security.md "Overload:
  refusals in the HTTP protocol"), CPU that then serves admitted requests.
* **A bounded request head while it is read**, as h11's ``max_incomplete_event_size`` bounds it: a request line and
  headers still incomplete past ``limits.max_header_bytes`` (counted over the reads after the one in which the
  request began, so at most that plus two socket reads are buffered) get a plain-text 400 and the connection is
  closed. Heads within the bound are checked exactly once parsed (414 / 431, ``gateway.app.HeadLimitMiddleware``).

The settings come from the ASGI app the server runs (``app.state.runtime`` and, on the public app,
``app.state.shedder``), found through the wrappers uvicorn puts around it, so that this class is importable by name
(uvicorn's worker processes pickle their config). A pipelined request behind one still in flight is never refused
here (answers must keep their order): it goes the ordinary way, where ShedMiddleware refuses it.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.admission import Shedder

__all__ = ["GatewayHttpProtocol"]

_UNWRAP_DEPTH: Final = 8  # uvicorn's wrappers (proxy headers, message logger) around the app


def _app_state(app: Any) -> Any:
    """The ``state`` of the first app down the ``.app`` chain of ``app`` that carries a gateway runtime, or None."""
    for _ in range(_UNWRAP_DEPTH):
        state = getattr(app, "state", None)
        if getattr(state, "runtime", None) is not None:
            return state
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus early refusals and a head bound while reading (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        state = _app_state(self.app)
        self._shedder: Shedder | None = getattr(state, "shedder", None)
        self._head_limit: int | None = (
            state.runtime.settings.limits.max_header_bytes if state is not None else None
        )
        self._in_head = False  # a request began and its headers are not complete yet
        self._began = False  # a request began in the read being parsed
        self._head_bytes = 0  # bytes of the reads after the one in which it began
        self._refused = False  # the current request was answered here: skip its body

    def data_received(self, data: bytes) -> None:
        self._began = False
        super().data_received(data)
        # Only reads that belong to the head as a whole count: one in which a request began may end the previous one.
        if not self._in_head or self._began or self._head_limit is None:
            return
        self._head_bytes += len(data)
        if self._head_bytes > self._head_limit and not self.transport.is_closing():
            self.send_400_response(
                f"Request line and headers too large: more than {self._head_limit} bytes still incomplete "
                "(limits.max_header_bytes)"
            )

    def on_message_begin(self) -> None:
        self._in_head = self._began = True
        self._head_bytes = 0
        self._refused = False
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        if (
            self._shedder is not None
            and self._idle()
            and not self.parser.should_upgrade()  # an Upgrade goes the ordinary way, refused by the middleware
        ):
            # None for a path it never refuses; a /v1/ request let through is marked judged in its scope (Shedder)
            refusal = self._shedder.refusal(self.url.decode("latin-1"), self.scope)  # type: ignore[arg-type]
            if refusal is not None:
                self._refuse(*refusal)
                return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            if self._shedder is not None:
                self._shedder.pend(self.scope)  # type: ignore[arg-type]  # its body is in: pending if judged
            super().on_message_complete()
        elif self.timeout_keep_alive_task is None and not self.transport.is_closing():
            # its body's reads cancelled the keep-alive timer the refusal armed
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _idle(self) -> bool:
        """No earlier request of this connection is still being answered."""
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def _refuse(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Write the whole refusal now; keep the connection when the client keeps it (HTTP/1.1 keep-alive)."""
        self._refused = True
        # After a refusal of a request sent with "Expect: 100-continue" the client may send no body: what it sends next
        # could not be told from that body, so the connection ends.
        keep = (
            self.parser.get_http_version() != "1.0"
            and self.parser.should_keep_alive()
            and not self.expect_100_continue
        )
        out = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
        for name, value in (*self.server_state.default_headers, *headers):
            out += (name, b": ", value, b"\r\n")
        if not keep:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", body)
        self.transport.write(b"".join(out))
        if keep:
            self.on_response_complete()  # counts it, arms the keep-alive timer
        else:
            self.server_state.total_requests += 1
            self.transport.close()
