"""Run the gateway on uvicorn: the public port and, when ``ops_port`` is set, the ops port, in one process.

:func:`limit_options` gives the uvicorn options that enforce ``limits`` while reading a request (HTTP parser, largest
request line + headers); :func:`run` serves ``app`` (and ``app.state.ops_app`` when present) until SIGTERM/SIGINT,
which stop both servers gracefully (in-flight requests finish, up to ``timeout_graceful_shutdown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from schemas.gateway_settings import GatewaySettings

__all__ = ["limit_options", "loop_factory", "run", "serve"]


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


async def serve(app: FastAPI, settings: GatewaySettings, **options: Any) -> None:
    """Serve until a signal; ``options`` are extra ``uvicorn.Config`` keywords for the public port."""
    base: dict[str, Any] = {
        "log_config": None,
        "access_log": False,
        **limit_options(settings),
    }
    servers = [_Server(uvicorn.Config(app, host=settings.host, port=settings.port, **{**base, **options}))]
    ops_app = getattr(app.state, "ops_app", None)
    if ops_app is not None and settings.ops_port is not None:
        ops_host = settings.ops_host or settings.host
        servers.append(
            _Server(uvicorn.Config(ops_app, host=ops_host, port=settings.ops_port, lifespan="off", **base))
        )
    loop = asyncio.get_running_loop()

    def stop(sig: int) -> None:
        for s in servers:
            s.handle_exit(sig, None)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    main = asyncio.create_task(servers[0].serve())
    others = [asyncio.create_task(s.serve()) for s in servers[1:]]
    try:
        await main
    finally:
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
