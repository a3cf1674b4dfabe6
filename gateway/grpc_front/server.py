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

The port itself (``grpc_front: gate``, the default) is the native gRPC gate's (``native/src/gate.rs`` through
:func:`gateway.native.grpc_gate`): a thread that never takes the GIL, refusing calls to TF Serving's services while the
gateway's admission would refuse them (the state :meth:`Admission.observe` publishes) or while the calls it relayed
and not yet answered fill the admission limit, its queue room and a margin, and relaying every other call, frame by
frame, to this ``grpc.aio`` server on a Unix socket in a private directory. With ``grpc_front: python`` or the native
path off (``EMBEDGATE_NATIVE=off``, or the module missing) this server listens on the port itself. The gate's refusals are
counted as the front's own (``embedgate_admission_shed_total{reason}``: ``queue_full``, ``loop_lag``, and
``grpc_gate`` for its own bound), read from the gate at every ``/metrics`` scrape and every second.

With ``grpc_direct`` (the default) the gate relays only the health service and compressed calls: it receives the
calls to TF Serving's methods whole, only from a caller with a known token and within the buffered-bytes budget, and
a dispatcher thread hands each to the gateway's loop (:class:`~gateway.grpc_front.servicer.DirectCalls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import sys
import tempfile
import threading
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway import native
from gateway.errors import GatewayError, public_message
from gateway.grpc_front.servicer import (
    MODEL_SERVICE,
    PREDICTION_SERVICE,
    DirectCalls,
    body_timeout_text,
    direct_calls,
    generic_handlers,
)
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
_GATE_REASONS: Final = ("queue_full", "loop_lag", "grpc_gate")  # GrpcGate.take_refused's order
_GATED_OPTIONS: Final = (("grpc.http2.max_frame_size", 1 << 20), ("grpc.http2.lookahead_bytes", 4 << 20))
_GATE_SYNC_S: Final = 1.0  # how often the gate's refusals are added to the metrics (also at every scrape)
_TAKE_S: Final = 0.5  # how long the dispatcher waits for a call received whole before it looks again


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
        self._gate: Any = None  # embedgate_native.GrpcGate while the gate listens
        self._observer: Any = None  # the gate's set_state, while admission tells it its state
        self._gate_dir: str | None = None
        self._gate_sync: asyncio.Task[None] | None = None
        self._dispatcher: threading.Thread | None = None  # while the gate receives calls whole (grpc_direct)
        self._tokens_at = -1  # the Authenticator generation last given to the gate
        self.front = "python"  # what listens on the port: "gate" or "python"

    def _build(self, core_loop: asyncio.AbstractEventLoop, gated: bool) -> None:
        """The server and its services (on the gRPC loop); ``gated``: behind the native gate, on its Unix socket."""
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
                # behind the gate: one connection carries every call, so large frames and windows (fewer frames and
                # window updates per message on the socket between them)
                *(_GATED_OPTIONS if gated else ()),
            ]
        )
        self._server.add_generic_rpc_handlers(generic_handlers(self._rt, core_loop))
        self._health = _Health(self._rt)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    async def _start_here(
        self, core_loop: asyncio.AbstractEventLoop, models: dict[str, str], ready: bool, address: str
    ) -> int:
        self._build(core_loop, gated=address.startswith("unix:"))
        assert self._server is not None and self._health is not None
        port: int = self._server.add_insecure_port(address)
        if port == 0:
            raise RuntimeError(f"cannot listen for gRPC on {address}")
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
        s = self._rt.settings
        gated = s.grpc_front == "gate" and native.path() == "native"
        address = self._address
        if gated:  # mkdtemp makes it 0700: only this user reaches the front behind the gate
            self._gate_dir = tempfile.mkdtemp(prefix="embedgate-grpc-")
            address = f"unix:{self._gate_dir}/front.sock"
        try:
            state = self._rt.readiness
            port = await self._on_grpc_loop(
                self._start_here(core_loop, dict(state.models), state.ready, address)
            )
            self.port = self._open_gate() if gated else port
        except BaseException:
            await self._stop_python(0)
            await self._close_loop()
            self._remove_gate_dir()
            raise
        self._rt.readiness.subscribe(self._update_health)
        log.info(
            "grpc started",
            extra={
                "address": self._address,
                "port": self.port,
                "grpc_front": self.front,
                "grpc_direct": self.direct,
            },
        )

    def _open_gate(self) -> int:
        """The native gate on the public address, in front of the Python server on the Unix socket (on the gateway's
        loop: admission's state is published from there). With ``grpc_direct`` the gate receives the calls of
        :class:`DirectCalls` whole and a dispatcher thread hands each to the gateway's loop."""
        s = self._rt.settings
        limiter = self._rt.limiter
        core_loop = asyncio.get_running_loop()
        direct = direct_calls(self._rt, core_loop, self._tokens_stale) if s.grpc_direct else None
        try:
            gate = native.grpc_gate(
                s.host,
                s.grpc_port,
                f"{self._gate_dir}/front.sock",
                limiter.limit,
                s.max_in_flight,
                f"{s.admission.max_loop_lag_s:g}",
                8 if s.overload_status == 429 else 14,
                direct=sorted(direct.methods) if direct is not None else [],
                max_message=min(s.max_body_bytes, 2**31 - 1),
                max_calls=max(1, s.max_in_flight),
                max_bytes=self._rt.buffered.limit,
                bytes_text=self._rt.buffered.refusal_text,
                tokens=self._rt.auth.tokens() if self._rt.auth is not None else None,
                receive_timeout_s=s.limits.body_timeout_s,
                timeout_text=body_timeout_text(s.limits.body_timeout_s),
            )
        except OSError as exc:
            raise RuntimeError(str(exc)) from None
        if gate is None:  # native path turned off meanwhile: cannot happen after the check in start()
            raise RuntimeError("the native gRPC gate is not available")
        self._gate = gate
        self.front = "gate"
        if direct is not None:
            self._tokens_at = self._rt.auth.generation if self._rt.auth is not None else 0
            self._dispatcher = threading.Thread(
                target=self._dispatch,
                args=(gate, direct, core_loop),
                name="embedgate-grpc-direct",
                daemon=True,
            )
            self._dispatcher.start()
        self._observer = gate.set_state
        limiter.observe(self._observer)
        self._rt.metrics.collect_hooks.append(self._count_gate_refusals)
        self._gate_sync = asyncio.create_task(self._sync_gate(), name="grpc-gate-metrics")
        port: int = gate.port
        return port

    @staticmethod
    def _dispatch(gate: Any, direct: DirectCalls, core_loop: asyncio.AbstractEventLoop) -> None:
        """The dispatcher thread: each call the gate received whole, its message taken (one copy, mostly off the
        interpreter lock), handed to the gateway's loop; ends when the gate is closed and its queue empty."""
        while True:
            call = gate.next_call(_TAKE_S)
            if call is None:
                if gate.closed:
                    return
                continue
            raw = call.take_message() if call.received else None
            try:
                core_loop.call_soon_threadsafe(direct.start, call, raw)
            except RuntimeError:  # the loop is closed: the process is ending
                call.respond(14, "The gateway is shutting down; retry")
                return

    @property
    def direct(self) -> bool:
        """Whether the gate receives calls to TF Serving's services whole (``grpc_direct``)."""
        return self._dispatcher is not None

    def _give_tokens(self) -> None:
        """The tokens file's tokens to the gate when they changed (checked every :data:`_GATE_SYNC_S`; without a
        tokens file the gate was built with none and receives every call's message)."""
        auth = self._rt.auth
        if self._gate is None or not self.direct or auth is None:
            return
        tokens = auth.tokens()  # re-reads the file when due
        if auth.generation != self._tokens_at:
            self._gate.set_tokens(tokens)
            self._tokens_at = auth.generation

    def _tokens_stale(self) -> None:
        self._tokens_at = -1
        self._give_tokens()

    @property
    def relayed(self) -> int:
        """Calls to TF Serving's services the gate relayed and that are not yet answered (0 without a gate)."""
        return int(self._gate.relayed) if self._gate is not None else 0

    def _count_gate_refusals(self) -> None:
        """Add the gate's refusals since the last call to the front's metrics (as :class:`Shedder` counts REST's)."""
        gate = self._gate
        if gate is None:
            return
        m = self._rt.metrics
        code = "RESOURCE_EXHAUSTED" if self._rt.settings.overload_status == 429 else "UNAVAILABLE"
        *shed, over_budget = gate.take_refused()
        m.count_gate_refusals(zip(_GATE_REASONS, shed, strict=True), code)
        if over_budget:  # limits.max_buffered_bytes: RESOURCE_EXHAUSTED whatever overload_status says
            m.rejected.inc(over_budget)
            m.requests.labels("_other", "", "other", "RESOURCE_EXHAUSTED").inc(over_budget)

    async def _sync_gate(self) -> None:
        while True:
            await asyncio.sleep(_GATE_SYNC_S)
            self._count_gate_refusals()
            self._give_tokens()

    def _remove_gate_dir(self) -> None:
        if self._gate_dir is not None:
            shutil.rmtree(self._gate_dir, ignore_errors=True)
            self._gate_dir = None

    async def stop(self, grace: float = 5.0) -> None:
        """Every health status NOT_SERVING; the gate (if any) stops listening, sends GOAWAY and waits up to
        ``grace`` for the calls it relayed; then the Python server stops within ``grace``."""
        self._rt.readiness.unsubscribe(self._update_health)
        if self._health is not None and self._loop is not None:
            await self._on_grpc_loop(self._health.enter_graceful_shutdown())
        if self._gate is not None:
            if self._observer is not None:
                self._rt.limiter.unobserve(self._observer)
                self._observer = None
            if self._gate_sync is not None:
                self._gate_sync.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._gate_sync
                self._gate_sync = None
            await asyncio.to_thread(self._gate.close, grace)
            if self._dispatcher is not None:
                await asyncio.to_thread(self._dispatcher.join, 2 * _TAKE_S + 1)
                self._dispatcher = None
            with contextlib.suppress(ValueError):
                self._rt.metrics.collect_hooks.remove(self._count_gate_refusals)
            self._count_gate_refusals()  # its last refusals
            self._gate = None
        await self._stop_python(grace)
        await self._close_loop()
        self._remove_gate_dir()

    async def _stop_python(self, grace: float) -> None:
        if self._server is not None and self._loop is not None:
            await self._on_grpc_loop(self._server.stop(grace))

    async def _close_loop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 10.0)
        self._loop = None
        self._thread = None
