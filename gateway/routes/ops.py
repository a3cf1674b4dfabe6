"""Probes and metrics (not counted in metrics, not in the access log).

``router``: ``/healthz``, ``/readyz`` with per-model details, ``/metrics`` (the public port when ``ops_port`` is not
set, else the ops port). ``public_router``: ``/healthz`` and a bare ``/readyz`` (status only), for the public port
when ``ops_port`` is set.

``/readyz`` answers from :class:`gateway.readiness.Readiness`, kept by the gateway's own poller (``health_poll_s``):
no request makes a backend call. Who sees what: the ops port shows every detail to every caller (restrict it by
network). On the public port without ``ops_port``, the details (model names and reasons, replicas, cache) are shown
only when no tokens are configured, or to a caller with a valid token, and then only for the models that token may
use; anyone else gets the overall status only (no model names). Details never carry backend addresses on the public
port.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response

from gateway.deps import RuntimeDep
from gateway.errors import GatewayError, public_message
from gateway.lifespan import Runtime

__all__ = ["public_router", "router"]

router = APIRouter(tags=["operations"])
public_router = APIRouter(tags=["operations"])

_ALL = None  # a scope covering every model


@router.get("/healthz", summary="Liveness: the process answers")
@public_router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> Response:
    return Response(b'{"status": "ok"}', media_type="application/json")


def _scope(rt: Runtime, request: Request) -> tuple[bool, frozenset[str] | None]:
    """Whether the caller may see details on the public port, and of which models (None: every model)."""
    if rt.auth is None:
        return True, _ALL
    try:
        return True, rt.auth.scope(request.headers.getlist("authorization"))
    except GatewayError:  # no valid token: the overall status only
        return False, _ALL


def _ready(rt: Runtime, details: bool, scope: frozenset[str] | None = _ALL) -> Response:
    """The readiness document from the poller's last result; with ``details``, those of the models in ``scope``
    (None: every model)."""
    state = rt.readiness
    if rt.gateway is None or state.polls == 0:
        return Response(b'{"status": "starting"}', status_code=503, media_type="application/json")
    ok = state.ready
    doc: dict[str, object] = {"status": "ready" if ok else "not ready"}
    if details:

        def shown(name: str) -> bool:
            return scope is None or name in scope

        on_ops_port = rt.settings.ops_port is not None
        doc["models"] = {
            k: (v if on_ops_port else public_message(v, rt.targets))
            for k, v in state.models.items()
            if shown(k)
        }
        if rt.positions:  # PS replicas catching up, per model and shard (never makes the gateway unready)
            doc["replicas"] = {name: t.status() for name, t in rt.positions.items() if shown(name)}
        if rt.stream is not None:  # the hot-row cache: serving or why not (never makes the gateway unready)
            status = rt.stream.status()
            models = status.get("models")
            if isinstance(models, dict):
                status = {**status, "models": {k: v for k, v in models.items() if shown(k)}}
            doc["cache"] = {"stream_lag_s": round(rt.stream.lag_s, 3), **status}
    return Response(json.dumps(doc).encode(), status_code=200 if ok else 503, media_type="application/json")


@router.get(
    "/readyz", summary="Readiness: every configured backend answered GetModelStatus with an AVAILABLE version"
)
async def readyz(rt: RuntimeDep, request: Request) -> Response:
    if rt.settings.ops_port is not None:
        return _ready(rt, True)
    return _ready(rt, *_scope(rt, request))


@public_router.get("/readyz", summary="Readiness (status only; details on the ops port)")
async def readyz_bare(rt: RuntimeDep) -> Response:
    return _ready(rt, False)


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(rt: RuntimeDep) -> Response:
    return Response(rt.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
