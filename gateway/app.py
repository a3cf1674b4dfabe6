"""``create_app(settings)``: routes, middleware, lifespan; nothing happens at import.

Reads each embedding model's manifest when the app is created, so a bad config fails at startup (the OpenAPI
document built from them is :mod:`gateway.openapi`). gRPC channels open in the lifespan.

With ``ops_port`` set, ``create_app`` also builds the operations app (``app.state.ops_app``: ``/metrics``, detailed
``/readyz``, ``/docs``, ``/redoc``, ``/openapi.json``) sharing the same Runtime; the public app then serves only
``/v1``, ``/healthz`` and a bare ``/readyz``. ``gateway.servers`` runs both.
"""

from __future__ import annotations

import logging
import time
import uuid

from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admission import Admission, Shedder, ShedMiddleware
from gateway.auth import Authenticator, exposure_problem
from gateway.codec.json_tensor import error_body
from gateway.errors import clip
from gateway.lifespan import Runtime, lifespan
from gateway.limits import BufferedBytes
from gateway.logs import REQUEST_ID
from gateway.metrics import Metrics
from gateway.openapi import add_docs
from gateway.routes import ops
from gateway.routes.v1 import V1_PATH, add_v1_routes, handle_v1
from schemas.deployment import EmbeddingModel
from schemas.gateway_settings import GatewaySettings
from schemas.manifest import Manifest

__all__ = ["create_app"]

log = logging.getLogger("embedgate.access")
_gw_log = logging.getLogger("embedgate.gateway")
_QUIET = ("/healthz", "/readyz", "/metrics")


class HeadLimitMiddleware:
    """The ops port's bound on the request head (the public app's is in :class:`RequestIdMiddleware`): 414 / 431 as
    there, whatever HTTP parser reads the requests."""

    def __init__(self, app: ASGIApp, max_headers: int = 100, max_header_bytes: int = 16384) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = (
            _head_problem(scope, self.max_headers, self.max_header_bytes) if scope["type"] == "http" else None
        )
        if problem is None:
            await self.app(scope, receive, send)
            return
        status, text = problem
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": error_body(text)})


class RequestIdMiddleware:
    """Echo or assign ``X-Request-Id``; one access log line per request (probes and /metrics excluded).

    ``/v1/...`` requests (any case, as TF Serving matches them) go straight to ``handle_v1``, which parses the path
    itself: skipping FastAPI's routing and dependency machinery saves a good part of the per-request overhead. This
    is the only dispatch path for ``/v1``; the documented ``/v1`` routes exist for the OpenAPI schema.
    """

    def __init__(
        self, app: ASGIApp, access_log: bool, max_headers: int = 100, max_header_bytes: int = 16384
    ) -> None:
        self.app = app
        self.access_log = access_log
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = _head_problem(scope, self.max_headers, self.max_header_bytes)
        if problem is not None:  # before anything looks at the headers
            status, text = problem
            body = error_body(text)
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        rid = ""
        for k, v in scope.get("headers", []):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:128]
                break
        rid = rid or uuid.uuid4().hex
        token = REQUEST_ID.set(rid)
        status = 0
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            if V1_PATH.fullmatch(scope["path"]):
                response = await handle_v1(Request(scope, receive))
                await response(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except (
            ClientDisconnect
        ):  # the client left while its answer was sent: INFO, no traceback, nothing to answer
            _gw_log.info("client disconnected", extra={"path": clip(scope["path"])})
        finally:
            if self.access_log and scope["path"] not in _QUIET:
                log.info(
                    "request",
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.perf_counter() - start) * 1000, 3),
                    },
                )
            REQUEST_ID.reset(token)


def create_app(settings: GatewaySettings) -> FastAPI:
    """The ASGI app for ``settings`` (manifests are read now; backends are connected in the lifespan)."""
    manifests: dict[str, Manifest] = {}
    for m in settings.models:
        if isinstance(m, EmbeddingModel):
            man = Manifest.load(m.manifest)
            if man.num_shards != len(m.shards):
                raise ValueError(
                    f"model {m.name!r}: manifest {m.manifest} has {man.num_shards} shards, config lists {len(m.shards)}"
                )
            manifests[m.name] = man
    problem = exposure_problem(settings)
    if problem is not None:
        raise ValueError(problem)
    targets: set[str] = set()
    for m in settings.models:
        if isinstance(m, EmbeddingModel):
            targets.add(m.entry)
            targets.update(t for sh in m.shards for t in sh.replicas)
        else:
            targets.add(m.target)
    tokens = settings.auth.tokens_file
    metrics = Metrics()
    runtime = Runtime(
        settings=settings,
        manifests=manifests,
        metrics=metrics,
        limiter=Admission(
            settings.max_in_flight,
            settings.overload_status,
            settings.retry_after_s,
            settings.admission,
            metrics,
        ),
        buffered=BufferedBytes(settings.limits.max_buffered_bytes, settings.retry_after_s),
        auth=Authenticator(tokens) if tokens is not None else None,
        model_names=frozenset(m.name for m in settings.models),
        targets=tuple(sorted(targets)),
    )
    split = settings.ops_port is not None
    app = FastAPI(
        title="embedgate gateway",
        description="TF Serving REST API in front of plain TF Serving models and entry + sharded-PS embedding models.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc: gateway.openapi.add_docs (local assets)
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs and not split else None,
    )
    app.state.runtime = runtime
    app.include_router(ops.public_router if split else ops.router)
    if not split:
        add_docs(app, settings, manifests)  # before the /v1 catch-all routes
    add_v1_routes(app)
    lim = settings.limits
    app.add_middleware(
        RequestIdMiddleware,
        access_log=settings.log.access,
        max_headers=lim.max_headers,
        max_header_bytes=lim.max_header_bytes,
    )
    # Refusals under overload: in the HTTP protocol before uvicorn builds the request (gateway.http_protocol finds
    # app.state.shedder), else outermost here, where they cost least.
    app.state.shedder = Shedder(runtime.limiter, metrics)
    app.add_middleware(ShedMiddleware, shedder=app.state.shedder)
    if split:
        app.state.ops_app = _ops_app(runtime, manifests)
    return app


def _ops_app(runtime: Runtime, manifests: dict[str, Manifest]) -> FastAPI:
    """The operations app: metrics, detailed readiness, docs of the public API. No lifespan of its own."""
    settings = runtime.settings
    ops_app = FastAPI(
        title="embedgate gateway",
        description="Operations port: metrics, readiness details, and the documentation of the public REST API.",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs else None,
    )
    ops_app.state.runtime = runtime
    ops_app.include_router(ops.router)
    lim = settings.limits
    ops_app.add_middleware(
        HeadLimitMiddleware, max_headers=lim.max_headers, max_header_bytes=lim.max_header_bytes
    )
    add_docs(ops_app, settings, manifests)
    return ops_app


def _head_problem(scope: Scope, max_count: int, max_bytes: int) -> tuple[int, str] | None:
    """(status, message) when the request head is over the limits: 414 when the request line (method, target,
    version) alone is over ``max_bytes``, 431 when there are too many headers or the request line and the headers
    together are over ``max_bytes``; None when it is within them."""
    target = len(scope.get("raw_path") or scope.get("path", "").encode()) + len(
        scope.get("query_string", b"")
    )
    line = len(scope.get("method", "")) + target + 12  # "GET <target>?<query> HTTP/1.1\r\n"
    if line > max_bytes:
        return 414, f"Request line too long: {line} bytes, the limit is {max_bytes} (limits.max_header_bytes)"
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    if len(headers) > max_count:
        return 431, f"Too many request headers: {len(headers)}, the limit is {max_count} (limits.max_headers)"
    size = line + sum(len(k) + len(v) + 4 for k, v in headers)
    if size > max_bytes:
        return 431, (
            f"Request line and headers too large: {size} bytes, the limit is {max_bytes} (limits.max_header_bytes)"
        )
    return None
