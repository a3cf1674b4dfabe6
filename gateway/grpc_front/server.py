"""The gateway's gRPC server (``grpc_port``): TF Serving's services plus the standard gRPC health service.

Started and stopped by the app lifespan (``grpc.aio``, on an event loop and thread of its own: :class:`GrpcFront`);
REST and gRPC share one ``Runtime``: the same gateway core, limiter and metrics, on uvicorn's event loop.

Health (``grpc.health.v1.Health``): the services ``""``, ``tensorflow.serving.PredictionService`` and
``tensorflow.serving.ModelService`` are SERVING when every configured model is ready, each configured model name has
its own status. Every status comes from the gateway's readiness poller (:mod:`gateway.readiness`, ``health_poll_s``,
the state ``/readyz`` answers from): ``Check`` and ``Watch`` never call a backend. With tokens configured
(``auth.tokens_file``), a model name is answered only to a caller whose ``authorization`` metadata carries a token for
it: otherwise UNAUTHENTICATED / PERMISSION_DENIED, whether or not such a model exists (the three services above stay
open). Shutdown sets every status to NOT_SERVING first.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.errors import GatewayError, public_message
from gateway.grpc_front.servicer import MODEL_SERVICE, PREDICTION_SERVICE, generic_handlers
from gateway.lifespan import Runtime
from gateway.readiness import Readiness

__all__ = ["MIN_PENDING_CALLS", "OPEN_SERVICES", "GrpcFront", "pending_calls"]

log = logging.getLogger("embedgate.gateway")

OPEN_SERVICES: Final = ("", PREDICTION_SERVICE, MODEL_SERVICE)  # answered to anyone: the overall status
MIN_PENDING_CALLS: Final = 20_000
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_STATUS: Final = {s.value[0]: s for s in grpc.StatusCode}
_T = TypeVar("_T")


class _Health(health.aio.HealthServicer):  # type: ignore[misc]
    """The standard health service over :class:`Readiness` (statuses set after each poll, never per call)."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self._rt = rt
        self._server_status[""] = _NOT_SERVING

    async def update(self, models: dict[str, str], ready: bool) -> None:
        """Statuses from the last readiness poll (``Readiness.models`` and ``.ready``, copied on the gateway's loop)."""
        for name, reason in models.items():
            await self.set(name, _SERVING if reason == "ok" else _NOT_SERVING)
        overall = _SERVING if ready else _NOT_SERVING
        for service in OPEN_SERVICES:
            await self.set(service, overall)

    async def _authorize(self, service: str, context: Any) -> None:
        """Abort unless ``service`` is open or the caller's token may use that model (never tells whether it exists)."""
        auth = self._rt.auth
        if auth is None or service in OPEN_SERVICES:
            return
        values = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        try:
            auth.check([v if isinstance(v, str) else "" for v in values], service)
        except GatewayError as exc:
            code = _STATUS.get(int(exc.code), grpc.StatusCode.UNAUTHENTICATED)
            await context.abort(code, public_message(exc.message))

    async def Check(self, request: Any, context: Any) -> Any:
        await self._authorize(request.service, context)
        return await super().Check(request, context)

    async def Watch(self, request: Any, context: Any) -> Any:
        await self._authorize(request.service, context)
        return await super().Watch(request, context)


def pending_calls(max_in_flight: int) -> int:
    """How many calls the gRPC core may hold before the gateway takes them (:data:`MIN_PENDING_CALLS` or 64 per
    ``max_in_flight`` slot, whichever is more)."""
    return max(MIN_PENDING_CALLS, 64 * max_in_flight)


class GrpcFront:
    """One ``grpc.aio`` server on ``host:grpc_port``, on its own event loop in its own thread (``embedgate-grpc``).

    Why a thread of its own: ``grpc.aio`` takes new calls from its core one at a time, each a turn of the event loop
    it runs on. On the gateway's loop, busy with the requests in flight, calls then waited seconds in gRPC's queue
    before the gateway saw them (even to refuse them) under overload. On its own loop the server takes calls as fast
    as they arrive, checks the token and refuses overload there; the rest of each call runs on the gateway's loop
    (see ``gateway.grpc_front.servicer``). The thread still needs the interpreter: while the gateway's loop runs
    Python, CPython hands it over every switch interval (5 ms by default, which let the thread take only about 250
    calls/s), so :meth:`start` sets ``admission.switch_interval_s`` (0.5 ms). It also freezes the objects alive at
    start (``gc.freeze``: modules, descriptors, settings) out of the cyclic garbage collector: each of its collections
    holds the interpreter from both threads; under a flood of calls (each allocating tasks, futures and contexts)
    the collector ran in 10 % of this thread's samples (5 % of the process's) in a profile at 3x capacity, and its
    full collections walk every tracked object, the startup heap included unless frozen. :meth:`start` / :meth:`stop` are called from the gateway's loop.
    """

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._address = f"{rt.settings.host}:{rt.settings.grpc_port}"
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._health: _Health | None = None

    def _build(self, core_loop: asyncio.AbstractEventLoop) -> None:
        """The server and its services (on the gRPC loop)."""
        s = self._rt.settings
        # Requests are client bodies (max_body_bytes, as over REST); answers relay backend answers (the size the
        # backend channels accept).
        # Calls gRPC has accepted but not yet handed to the gateway wait in its core's queue; past its default
        # backlog (1,000, up to 3,000) gRPC cancels them at random, silently (the client sees CANCELLED). The queue
        # is made deep enough for any burst the gateway itself can refuse (RESOURCE_EXHAUSTED, counted): each
        # queued call costs a stream's state and at most one HTTP/2 flow-control window of its message.
        pending = pending_calls(s.max_in_flight)
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", min(s.max_body_bytes, 2**31 - 1)),
                ("grpc.max_send_message_length", s.grpc.max_receive_message_bytes),
                ("grpc.server.max_pending_requests", pending),
                ("grpc.server.max_pending_requests_hard_limit", pending),
            ]
        )
        self._server.add_generic_rpc_handlers(generic_handlers(self._rt, core_loop))
        self._health = _Health(self._rt)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    async def _start_here(
        self, core_loop: asyncio.AbstractEventLoop, models: dict[str, str], ready: bool
    ) -> int:
        self._build(core_loop)
        assert self._server is not None and self._health is not None
        port: int = self._server.add_insecure_port(self._address)
        if port == 0:
            raise RuntimeError(f"cannot listen for gRPC on {self._address}")
        await self._health.update(models, ready)
        await self._server.start()
        return port

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _on_grpc_loop(self, coro: Coroutine[Any, Any, _T]) -> _T:
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _update_health(self, state: Readiness) -> None:
        """A :class:`Readiness` listener (on the gateway's loop): the statuses set on the gRPC loop."""
        if self._health is not None:
            await self._on_grpc_loop(self._health.update(dict(state.models), state.ready))

    async def start(self) -> None:
        switch = self._rt.settings.admission.switch_interval_s
        if switch > 0:  # the gRPC thread gets the interpreter within this long while the gateway's loop runs
            sys.setswitchinterval(switch)
        if gc.get_freeze_count() == 0:  # once per process (a test process may start several fronts)
            gc.collect()
            gc.freeze()  # what is alive now lives as long as the process: never walked again by a collection
        core_loop = asyncio.get_running_loop()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(self._loop,), name="embedgate-grpc", daemon=True
        )
        self._thread.start()
        try:
            state = self._rt.readiness
            self.port = await self._on_grpc_loop(self._start_here(core_loop, dict(state.models), state.ready))
        except BaseException:
            await self._close_loop()
            raise
        self._rt.readiness.subscribe(self._update_health)
        log.info("grpc started", extra={"address": self._address})

    async def stop(self, grace: float = 5.0) -> None:
        self._rt.readiness.unsubscribe(self._update_health)
        if self._server is not None and self._health is not None:
            await self._on_grpc_loop(self._stop_here(grace))
        await self._close_loop()

    async def _stop_here(self, grace: float) -> None:
        assert self._server is not None and self._health is not None
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)

    async def _close_loop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 10.0)
        self._loop = None
        self._thread = None
