"""Run the gateway on uvicorn: the public port and, when ``ops_port`` is set, the ops port, in one process.

:func:`limit_options` gives the uvicorn options that enforce ``limits`` while reading a request (HTTP parser, largest
request line + headers); :func:`run` serves ``app`` (and ``app.state.ops_app`` when present) until SIGTERM/SIGINT,
which stop both servers gracefully (in-flight requests finish, up to ``timeout_graceful_shutdown``). With
``rest_front: gate`` (and the native path on) the public port is the native REST gate's (:class:`RestFront`), and
uvicorn serves the app on a Unix socket behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, Final

import uvicorn
from fastapi import FastAPI

from schemas.gateway_settings import GatewaySettings

__all__ = ["RestFront", "limit_options", "loop_factory", "rest_gate_unavailable", "run", "serve"]

log = logging.getLogger("embedgate.gateway")

_GATE_REASONS: Final = ("queue_full", "loop_lag", "rest_gate")  # RestGate.take_refused's order
_STARTED_S: Final = 60.0  # longest wait for uvicorn to listen on the gate's socket


def limit_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn options for ``settings.limits``: the HTTP protocol, which stops reading a request line + headers past
    max_header_bytes (``httptools``: :class:`gateway.http_protocol.GatewayHttpProtocol`, which also refuses under
    overload before the ASGI request; ``h11``: uvicorn's h11 protocol and its max incomplete event size)."""
    lim = settings.limits
    if lim.http_parser == "h11":
        return {"http": "h11", "h11_max_incomplete_event_size": lim.max_header_bytes}
    from gateway.http_protocol import GatewayHttpProtocol

    return {"http": GatewayHttpProtocol}


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to :func:`serve` (two servers share one process)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class RestFront:
    """The native REST gate on the public port (``rest_front: gate``; ``native/src/rest_gate.rs``): it answers the
    overload refusals of ``/v1/...`` requests itself while the app's admission would refuse any request (the state
    admission publishes to it, as to the gRPC gate) and relays every other request to uvicorn, which serves the app
    on the Unix socket :attr:`socket` in a private directory. Its refusals are counted in the app's metrics as the
    HTTP protocol's are (``embedgate_admission_shed_total``, reason ``rest_gate`` for its own relay bound)."""

    def __init__(self, app: FastAPI, settings: GatewaySettings, keep_alive_s: float) -> None:
        self._app = app
        self._settings = settings
        self._keep_alive_s = keep_alive_s
        self._dir = tempfile.mkdtemp(prefix="embedgate-rest-")
        self.socket = f"{self._dir}/http.sock"
        self._gate: Any = None  # embedgate_native.RestGate while it listens

    def open(self) -> bool:
        """Listen on the public port (on the app's loop, once uvicorn listens on :attr:`socket`); False when the
        native path is off (uvicorn must then listen on the port itself). Raises OSError when it cannot listen."""
        from gateway import native

        s = self._settings
        rt = self._app.state.runtime
        limiter = rt.limiter
        gate = native.rest_gate(
            s.host,
            s.port,
            self.socket,
            limiter.limit,
            s.max_in_flight,
            f"{s.admission.max_loop_lag_s:g}",
            s.overload_status,
            s.retry_after_s,
            self._keep_alive_s,
            s.workers > 1,
        )
        if gate is None:
            return False
        self._gate = gate
        limiter.observe(gate.set_state)
        self._app.state.shedder.on_seen = gate.seen
        rt.metrics.collect_hooks.append(self.count_refusals)
        log.info("rest started", extra={"rest_front": "gate", "port": gate.port, "upstream": self.socket})
        return True

    def count_refusals(self) -> None:
        """Add the gate's refusals since the last call to the app's metrics (as :class:`Shedder` counts its own)."""
        if self._gate is None:
            return
        code = "RESOURCE_EXHAUSTED" if self._settings.overload_status == 429 else "UNAVAILABLE"
        counts = zip(_GATE_REASONS, self._gate.take_refused(), strict=True)
        self._app.state.runtime.metrics.count_gate_refusals(counts, code)

    def stop_listening(self) -> None:
        """No new connection from now on (at a signal, before uvicorn stops: exchanges in progress finish)."""
        if self._gate is not None:
            self._gate.close(0.0)

    def close(self, grace_s: float = 2.0) -> None:
        """Stop listening, wait up to ``grace_s`` for the gate's connections to end (uvicorn has stopped: each ends
        when its exchange does), count the last refusals and remove the socket's directory."""
        gate = self._gate
        if gate is not None:
            rt = self._app.state.runtime
            rt.limiter.unobserve(gate.set_state)
            self._app.state.shedder.on_seen = None
            with contextlib.suppress(ValueError):
                rt.metrics.collect_hooks.remove(self.count_refusals)
            gate.close(grace_s)
            self.count_refusals()
            self._gate = None
        shutil.rmtree(self._dir, ignore_errors=True)


def rest_gate_unavailable(settings: GatewaySettings) -> str | None:
    """Why uvicorn listens on the public port itself (``rest_front: python``, TLS, the native path off), or None when
    the native REST gate does."""
    from gateway import native

    if settings.rest_front != "gate":
        return "rest_front: python"
    if settings.tls is not None:
        return "tls: the gate does not terminate TLS"
    if native.path() != "native":
        return "the native path is off (EMBEDGATE_NATIVE=off, or embedgate_native not installed)"
    return None


async def _open_when_listening(front: RestFront, server: uvicorn.Server, serving: asyncio.Task[None]) -> None:
    """Open ``front`` once ``server`` listens on its socket (or ``serving`` ended first)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + _STARTED_S
    while not server.started:
        if serving.done() or loop.time() > end:
            return
        await asyncio.sleep(0.01)
    if not front.open():
        raise RuntimeError("rest_front 'gate' needs the native module (embedgate_native), which is off")


async def serve(app: FastAPI, settings: GatewaySettings, **options: Any) -> None:
    """Serve until a signal; ``options`` are extra ``uvicorn.Config`` keywords for the public port."""
    base: dict[str, Any] = {
        "log_config": None,
        "access_log": False,
        **limit_options(settings),
    }
    front: RestFront | None = None
    why = rest_gate_unavailable(settings)
    if why is None:
        front = RestFront(app, settings, float(options.get("timeout_keep_alive", 5)))
        public = uvicorn.Config(app, uds=front.socket, **{**base, **options})
    else:
        public = uvicorn.Config(app, host=settings.host, port=settings.port, **{**base, **options})
        log.info("rest started", extra={"rest_front": "python", "port": settings.port, "why": why})
    servers = [_Server(public)]
    ops_app = getattr(app.state, "ops_app", None)
    if ops_app is not None and settings.ops_port is not None:
        ops_host = settings.ops_host or settings.host
        servers.append(
            _Server(uvicorn.Config(ops_app, host=ops_host, port=settings.ops_port, lifespan="off", **base))
        )
    loop = asyncio.get_running_loop()

    def stop(sig: int) -> None:
        if front is not None:
            front.stop_listening()  # no new connection reaches uvicorn while it stops
        for s in servers:
            s.handle_exit(sig, None)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    main = asyncio.create_task(servers[0].serve())
    others = [asyncio.create_task(s.serve()) for s in servers[1:]]
    try:
        if front is not None:
            try:
                await _open_when_listening(front, servers[0], main)
            except BaseException:
                stop(signal.SIGTERM)
                with contextlib.suppress(BaseException):
                    await main
                raise
        await main
    finally:
        if front is not None:
            await asyncio.to_thread(front.close)
        for s in servers[1:]:
            s.should_exit = True
        await asyncio.gather(*others, return_exceptions=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def loop_factory(settings: GatewaySettings) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new event loop of the kind ``settings.event_loop`` names (asyncio's default loop, or uvloop's)."""
    if settings.event_loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(app: FastAPI, settings: GatewaySettings, **options: Any) -> None:
    """Blocking :func:`serve` on a new event loop (``settings.event_loop``)."""
    with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
        runner.run(serve(app, settings, **options))
