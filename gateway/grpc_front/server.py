"""The gateway's gRPC server (``grpc_port``): TF Serving's services plus the standard gRPC health service.

Started and stopped by the app lifespan, in uvicorn's event loop (``grpc.aio``), so REST and gRPC share one
``Runtime``: the same gateway core, limiter and metrics.

Health (``grpc.health.v1.Health``): the services ``""``, ``tensorflow.serving.PredictionService`` and
``tensorflow.serving.ModelService`` are SERVING when every configured model is ready (every backend answers
GetModelStatus with an AVAILABLE version, as ``/readyz``), each configured model name has its own status; ``Check`` re-probes the backends before answering, and a background task refreshes the statuses every
``HEALTH_REFRESH_S`` seconds for ``Watch``. Shutdown sets every status to NOT_SERVING first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.grpc_front.servicer import MODEL_SERVICE, PREDICTION_SERVICE, generic_handlers
from gateway.lifespan import Runtime

__all__ = ["HEALTH_REFRESH_S", "MIN_PENDING_CALLS", "GrpcFront", "pending_calls"]

log = logging.getLogger("embedgate.gateway")

HEALTH_REFRESH_S: Final = 5.0
MIN_PENDING_CALLS: Final = 20_000
_PROBE_TIMEOUT_S: Final = 2.0
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Health(health.aio.HealthServicer):  # type: ignore[misc]
    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self._rt = rt
        self._server_status[""] = _NOT_SERVING

    async def refresh(self) -> None:
        gw = self._rt.gateway
        if gw is None:
            return
        deadline = time.monotonic() + min(_PROBE_TIMEOUT_S, self._rt.settings.request_timeout_s)
        models = await gw.ready(deadline)
        for name, state in models.items():
            await self.set(name, _SERVING if state == "ok" else _NOT_SERVING)
        overall = _SERVING if all(v == "ok" for v in models.values()) else _NOT_SERVING
        for service in ("", PREDICTION_SERVICE, MODEL_SERVICE):
            await self.set(service, overall)

    async def Check(self, request: Any, context: Any) -> Any:
        await self.refresh()
        return await super().Check(request, context)


def pending_calls(max_in_flight: int) -> int:
    """How many calls the gRPC core may hold before the gateway takes them (:data:`MIN_PENDING_CALLS` or 64 per
    ``max_in_flight`` slot, whichever is more)."""
    return max(MIN_PENDING_CALLS, 64 * max_in_flight)


class GrpcFront:
    """One ``grpc.aio`` server on ``host:grpc_port``; :meth:`start` / :meth:`stop` inside the running loop."""

    def __init__(self, rt: Runtime) -> None:
        s = rt.settings
        self._rt = rt
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
        self._server.add_generic_rpc_handlers(generic_handlers(rt))
        self._health = _Health(rt)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._address = f"{s.host}:{s.grpc_port}"
        self._refresher: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        self.port = self._server.add_insecure_port(self._address)
        if self.port == 0:
            raise RuntimeError(f"cannot listen for gRPC on {self._address}")
        await self._server.start()
        self._refresher = asyncio.create_task(self._refresh_loop(), name="grpc-health-refresh")
        log.info("grpc started", extra={"address": self._address})

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self._health.refresh()
            except Exception:  # a probe failure must not end the loop; the next round retries
                log.exception("grpc health refresh failed")
            await asyncio.sleep(HEALTH_REFRESH_S)

    async def stop(self, grace: float = 5.0) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
