"""Probes and metrics (not counted in metrics, not in the access log).

``router``: ``/healthz``, ``/readyz`` with per-model details, ``/metrics`` (the public port when ``ops_port`` is not
set, else the ops port). ``public_router``: ``/healthz`` and a bare ``/readyz`` (status only), for the public port
when ``ops_port`` is set. Details never carry backend addresses on the public port.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Response

from gateway.deps import RuntimeDep
from gateway.errors import public_message

__all__ = ["public_router", "router"]

router = APIRouter(tags=["operations"])
public_router = APIRouter(tags=["operations"])
_PROBE_TIMEOUT_S = 2.0


@router.get("/healthz", summary="Liveness: the process answers")
@public_router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> Response:
    return Response(b'{"status": "ok"}', media_type="application/json")


async def _ready(rt: RuntimeDep, details: bool) -> Response:
    if rt.gateway is None:
        return Response(b'{"status": "starting"}', status_code=503, media_type="application/json")
    deadline = time.monotonic() + min(_PROBE_TIMEOUT_S, rt.settings.request_timeout_s)
    models = await rt.gateway.ready(deadline)
    ok = all(v == "ok" for v in models.values())
    doc: dict[str, object] = {"status": "ready" if ok else "not ready"}
    if details:
        on_ops_port = rt.settings.ops_port is not None
        doc["models"] = (
            models if on_ops_port else {k: public_message(v, rt.targets) for k, v in models.items()}
        )
        if rt.positions:  # PS replicas catching up, per model and shard (never makes the gateway unready)
            doc["replicas"] = {name: tracker.status() for name, tracker in rt.positions.items()}
        if rt.stream is not None:  # the hot-row cache: serving or why not (never makes the gateway unready)
            doc["cache"] = {"stream_lag_s": round(rt.stream.lag_s, 3), **rt.stream.status()}
    return Response(json.dumps(doc).encode(), status_code=200 if ok else 503, media_type="application/json")


@router.get(
    "/readyz", summary="Readiness: every configured backend answers GetModelStatus with an AVAILABLE version"
)
async def readyz(rt: RuntimeDep) -> Response:
    return await _ready(rt, details=True)


@public_router.get("/readyz", summary="Readiness (status only; details on the ops port)")
async def readyz_bare(rt: RuntimeDep) -> Response:
    return await _ready(rt, details=False)


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(rt: RuntimeDep) -> Response:
    return Response(rt.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
