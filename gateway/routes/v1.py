"""TF Serving's REST API: every ``/v1/...`` request is parsed with TF Serving's own path rules, then one core call.

There is one dispatch path: the request-id middleware (``gateway.app``) hands every path matching ``V1_PATH`` to
:func:`handle_v1` without FastAPI's router (cheaper per request), so matching, percent-decoding, ``Malformed
request`` answers and error texts are exactly TF Serving's. The OpenAPI document describing ``/v1`` is
:mod:`gateway.openapi`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI, Request, Response
from starlette.requests import ClientDisconnect

from gateway.admission import settle
from gateway.codec.json_tensor import error_body
from gateway.core.embedding import EmbeddingServable
from gateway.core.gateway import Gateway
from gateway.core.requests import ClassifyRequest, MetadataRequest, PredictRequest, StatusRequest, VersionSpec
from gateway.errors import (
    Cancelled,
    DeadlineExceeded,
    GatewayError,
    Internal,
    InvalidArgument,
    RequestTimeout,
    ResourceExhausted,
    clip,
    public_message,
)
from gateway.lifespan import Call, Runtime
from gateway.limits import (
    current_limits,
    offload,
    parse_document,
    parse_pool,
    plain_scope,
    read_body,
    release_memory_soon,
    request_scope,
)
from gateway.native import FallbackSink
from gateway.routes.rest_codec import (
    ProcessJsonInputs,
    check_post,
    classify_json,
    metadata_json,
    parse_classify_regress,
    parse_predict,
    parse_predict_embedding,
    parse_predict_native,
    predict_json,
    regress_json,
    status_json,
)
from schemas.gateway_settings import LimitsSettings
from schemas.manifest import Manifest

__all__ = ["DEGRADED_HEADER", "V1_PATH", "add_v1_routes", "handle_v1"]

log = logging.getLogger("embedgate.gateway")

_PREDICT = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.IGNORECASE,
)
_STATUS = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?", re.IGNORECASE
)
_VERBS = ("predict", "classify", "regress")  # the regex matches any case, TF Serving's handler only these
_INT64_MAX = 2**63 - 1
DEGRADED_HEADER = "X-Embedgate-Degraded"  # why an answer is degraded (docs/gateway.md); absent: it is not
V1_PATH = re.compile(r"/v1/.*", re.IGNORECASE | re.DOTALL)  # what TF Serving hands to its REST handler


def _raw_path(request: Request) -> str:
    raw = request.scope.get("raw_path")
    path: str = raw.decode("latin-1") if raw else request.scope["path"]
    qs = request.scope.get("query_string", b"")
    return path + ("?" + qs.decode("latin-1") if qs else "")


_MAX_VERSION_DIGITS = 19  # int64 has at most 19 digits; longer texts are never converted (no huge int())


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > _MAX_VERSION_DIGITS or int(digits) > _INT64_MAX:
        shown = text if len(text) <= 32 else f"{text[:32]}... ({len(text)} digits)"
        raise InvalidArgument(f"Failed to convert version: {shown} to numeric.")
    return int(digits)


def _spec(version: str | None, label: str | None) -> VersionSpec:
    return VersionSpec(_version(version), unquote(label) if label is not None else None)


class _ClientLeft(Cancelled):
    """The client disconnected while sending its body (outcome CANCELLED; not a backend's CANCELLED)."""


@dataclass
class _Target:
    """What the path asked for; ``api`` is "predict" / "classify" / "regress" / "metadata" / "status"."""

    api: str
    model: str
    spec: VersionSpec


def _route(method: str, path: str) -> _Target:
    m = _PREDICT.fullmatch(path) if method == "POST" else None
    if m is not None and m.group(4) in _VERBS:
        return _Target(m.group(4), unquote(m.group(1)), _spec(m.group(2), m.group(3)))
    s = _STATUS.fullmatch(path) if method == "GET" else None
    if s is not None:
        if s.group(1) is None:
            raise InvalidArgument("Missing model name in request.")
        api = "metadata" if s.group(4) is not None else "status"
        return _Target(api, unquote(s.group(1)), _spec(s.group(2), s.group(3)))
    raise InvalidArgument(f"Malformed request: {clip(method)} {clip(path)}")


def _error_response(rt: Runtime, exc: GatewayError) -> Response:
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(int(exc.retry_after))
    elif exc.retriable:  # a backend's UNAVAILABLE / RESOURCE_EXHAUSTED
        headers["Retry-After"] = str(rt.settings.retry_after_s)
    message = public_message(exc.message, rt.targets)
    try:
        body = error_body(message)
    except TypeError:  # a string orjson cannot encode (lone surrogate): escape it
        body = error_body(message.encode("utf-8", "backslashreplace").decode("utf-8"))
    return Response(body, status_code=exc.http_status, media_type="application/json", headers=headers)


async def handle_v1(request: Request) -> Response:
    """Every ``/v1/...`` request (the request-id middleware calls this directly: the one dispatch path)."""
    if request.method == "OPTIONS":  # CORS preflight, answered as TF Serving's http_server.cc does
        origin = request.headers.get("origin", "")
        if origin.startswith(("http://", "https://")):
            return Response(status_code=200)
        return Response(
            b"Origin header is missing in CORS preflight", status_code=400, media_type="text/plain"
        )
    rt: Runtime = request.app.state.runtime
    path = _raw_path(request)
    held = [0]  # body bytes reserved in rt.buffered, released at the end
    try:
        with rt.track(admit=False) as call:
            return await _answer(request, rt, path, call, held)
    except _ClientLeft:  # the client left while sending its body: nobody to answer; INFO, no traceback
        rt.metrics.client_disconnects.inc()
        log.info("client disconnected", extra={"path": clip(path)})
        return Response(status_code=499)
    except GatewayError as exc:
        return _error_response(rt, exc)
    except Exception:  # our bug: answer 500 as JSON and log the traceback; no internals in the body
        log.exception("unhandled error", extra={"path": path})
        return _error_response(rt, Internal("Internal error; see the gateway log for this request id"))
    finally:
        if held[0]:
            rt.buffered.release(held[0])
            release_memory_soon(rt.executor, held[0])


async def _answer(request: Request, rt: Runtime, path: str, call: Call, held: list[int]) -> Response:
    """Check the token, read the body (bounded in time and size), take the in-flight slot, call the core once,
    encode the result; all within ``request_timeout_s`` (504 at the deadline, the work cancelled)."""
    timeout_s = rt.settings.request_timeout_s
    deadline = time.monotonic() + timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            return await _serve(request, rt, path, call, held, deadline)
    except TimeoutError:
        raise DeadlineExceeded(
            f"Deadline exceeded: the request took longer than {timeout_s:g} s (request_timeout_s)"
        ) from None


async def _serve(
    request: Request, rt: Runtime, path: str, call: Call, held: list[int], deadline: float
) -> Response:
    gw = rt.gateway
    if gw is None:
        raise Internal("gateway is not started")
    authorization = request.headers.getlist("authorization")  # several values are refused (gateway.auth)
    try:
        target = _route(request.method, path)
    except InvalidArgument:
        if rt.auth is not None:  # no hints about paths to callers without a token
            rt.auth.check(authorization, None)
        raise
    call.model, call.api = target.model, target.api
    if rt.auth is not None:
        rt.auth.check(authorization, target.model)
    name, spec = target.model, target.spec
    version: int | None = None
    headers: dict[str, str] = {}
    if call.api in _VERBS:
        raw = await _read(request, rt, held)
        try:
            await call.admit_queued()  # only now: a slow sender holds no slot
        finally:
            settle(request.scope)  # counted by admission now (gateway.admission.Pending)
        with request_scope(rt.settings.limits, rt.executor, len(raw), rt.procs):
            body, version, call.degraded = await _post(
                gw, call.api, name, spec, raw, deadline, rt.metrics.native_fallback
            )
        if call.degraded is not None:
            headers[DEGRADED_HEADER] = call.degraded
    else:
        try:
            await call.admit_queued()
        finally:
            settle(request.scope)
        if call.api == "metadata":
            meta = await gw.handle(MetadataRequest(name, spec), deadline)
            body, version = metadata_json(name, meta), meta.version
        else:
            body = status_json(await gw.handle(StatusRequest(name, spec), deadline))
    call.version = "" if version is None else str(version)
    return Response(body, media_type="application/json", headers=headers)


async def _read(request: Request, rt: Runtime, held: list[int]) -> bytes:
    """The body within ``limits.body_timeout_s`` (408 after); a client that leaves is ``Cancelled``."""
    body_timeout = rt.settings.limits.body_timeout_s
    reading = asyncio.timeout(body_timeout)
    try:
        async with reading:
            return await read_body(
                request,
                rt.settings.max_body_bytes,
                rt.buffered,
                held,
                executor=rt.executor,
                max_ratio=rt.settings.limits.max_decompression_ratio,
            )
    except TimeoutError:
        if not reading.expired():
            raise
        raise RequestTimeout(
            f"Request body not received within {body_timeout:g} s (limits.body_timeout_s)"
        ) from None
    except ClientDisconnect:
        raise _ClientLeft("Client disconnected before sending the whole body") from None
    except ResourceExhausted:  # limits.max_buffered_bytes: refused like a full max_in_flight
        rt.metrics.rejected.inc()
        raise


def _parse_post(api: str, name: str, spec: VersionSpec, raw: bytes, limits: LimitsSettings) -> Any:
    """The typed request of a POST body (pure; on the parse threads when the body is large)."""
    if api == "predict" and (one_pass := parse_predict_native(name, spec, raw, limits)) is not None:
        return one_pass
    doc = parse_document(raw, limits)
    if api == "predict":
        return parse_predict(name, spec, doc, raw)
    return parse_classify_regress(api, name, spec, doc)


def _embedding_manifest(gw: Gateway, name: str) -> Manifest | None:
    """The latest manifest of model ``name`` when it is an embedding model (None: pass-through or unknown)."""
    servable = gw.servables.get(name)
    return servable.manifest if isinstance(servable, EmbeddingServable) else None


async def _parse_large_or_inline(api: str, name: str, spec: VersionSpec, raw: bytes) -> Any:
    """The typed request of a POST body: checked in a parse worker process when the body is large (this process's
    GIL stays free), else by :func:`_parse_post` (inline, or on the parse threads)."""
    procs = parse_pool()
    if procs is None:
        return await offload(_parse_post, api, name, spec, raw, current_limits())
    checked = await procs.acall(check_post, api, name, spec, raw, current_limits())
    if isinstance(checked, tuple):
        sig, fast = checked
        inputs = ProcessJsonInputs(raw, fast, procs)
        return (PredictRequest(name, spec, sig, inputs), inputs)
    return checked


async def _predict(
    gw: Gateway, parsed: tuple[PredictRequest, Any], deadline: float
) -> tuple[bytes, int | None, str | None]:
    req, inputs = parsed
    result = await gw.handle(req, deadline)
    return await offload(predict_json, result, inputs.format), result.version, result.degraded


async def _post(
    gw: Gateway,
    api: str,
    name: str,
    spec: VersionSpec,
    raw: bytes,
    deadline: float,
    fallback: FallbackSink | None = None,
) -> tuple[bytes, int | None, str | None]:
    """predict / classify / regress: the JSON answer, the version that answered, the degraded reason (or None).

    An embedding model's predict body is first tried in one native pass (:func:`parse_predict_embedding`: it releases
    the GIL). Below ``limits.plain_offload_bytes`` that pass runs inline and, when it answers, so does the rest of
    the request (:func:`~gateway.limits.plain_scope`); from that size it runs on the parse threads. The parse worker
    processes and the reference take whatever it declines (``fallback`` is told)."""
    parsed: Any = None
    if api == "predict" and (manifest := _embedding_manifest(gw, name)) is not None:
        limits = current_limits()
        if len(raw) < limits.plain_offload_bytes:
            # below plain_offload_bytes the one native pass (no GIL) and what follows cost less than the thread hops
            # of a large body: tried inline; a body it declines goes the usual way below
            parsed = parse_predict_embedding(name, spec, raw, limits, manifest, fallback)
            if parsed is not None:
                with plain_scope(len(raw)):
                    del raw
                    return await _predict(gw, parsed, deadline)
        else:
            parsed = await offload(parse_predict_embedding, name, spec, raw, limits, manifest, fallback)
    if parsed is None:
        parsed = await _parse_large_or_inline(api, name, spec, raw)
    del raw
    if api == "predict":
        return await _predict(gw, parsed, deadline)
    if isinstance(parsed, ClassifyRequest):
        classified = await gw.handle(parsed, deadline)
        return await offload(classify_json, classified), classified.version, classified.degraded
    regressed = await gw.handle(parsed, deadline)
    return await offload(regress_json, regressed), regressed.version, regressed.degraded


# ---- routes -------------------------------------------------------------------------------------------------------


def add_v1_routes(app: FastAPI) -> None:
    """The catch-all routes (the OpenAPI document describing ``/v1`` is :mod:`gateway.openapi`)."""
    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    # /v1/... never reaches the router (the middleware answers it); anything else unknown is a plain 404.
    app.add_api_route("/{rest:path}", _not_found, include_in_schema=False, methods=methods)


async def _not_found(request: Request) -> Response:
    return Response(b"Not Found", status_code=404, media_type="text/plain")
