"""TF Serving's gRPC API over the gateway core: read and parse the request proto, call ``Gateway.handle`` once, build
the reply.

Handlers are registered as generic handlers under TF Serving's service names, so the official
``tensorflow-serving-api`` stubs call them: ``/tensorflow.serving.PredictionService/{Predict, Classify, Regress,
GetModelMetadata}`` and ``/tensorflow.serving.ModelService/GetModelStatus``. Every call goes through the same
``Runtime.track`` as REST (``max_in_flight``, request metrics) and gets the request deadline (``request_timeout_s``,
or the client's gRPC deadline when sooner). A :class:`~gateway.errors.GatewayError` becomes the gRPC status with the
same code and message.

Every method takes its message as bytes and parses it itself (:meth:`_Servicer._serve`), after the token check and
within REST's limits (``limits``: buffered bytes, ``max_instances``, sizes; ``gateway.grpc_front.messages``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

import grpc
from google.protobuf.message import Message

from gateway import native
from gateway.core.requests import (
    ClassifyRequest,
    ClassifyResult,
    MetadataRequest,
    PredictRequest,
    RegressRequest,
    RegressResult,
    StatusRequest,
    VersionSpec,
)
from gateway.errors import (
    GatewayError,
    Internal,
    InvalidArgument,
    RequestTimeout,
    ResourceExhausted,
    Unavailable,
    clip,
    public_message,
)
from gateway.grpc_front.messages import Parsed, check_message, check_spec_sizes, parse_message
from gateway.lifespan import Call, Runtime
from gateway.limits import offload, parse_pool, release_memory_soon, request_scope
from schemas.proto import tfs_pb2

if TYPE_CHECKING:
    from gateway.core.gateway import Gateway
    from gateway.features import FeatureBatch
    from schemas.gateway_settings import LimitsSettings
    from schemas.manifest import Manifest

__all__ = [
    "DEGRADED_METADATA_KEY",
    "MODEL_SERVICE",
    "PREDICTION_SERVICE",
    "DirectCalls",
    "TensorInputs",
    "body_timeout_text",
    "direct_calls",
    "generic_handlers",
    "offload_threshold",
]

log = logging.getLogger("embedgate.gateway")

PREDICTION_SERVICE: Final = "tensorflow.serving.PredictionService"
MODEL_SERVICE: Final = "tensorflow.serving.ModelService"
DEGRADED_METADATA_KEY: Final = "x-embedgate-degraded"  # trailing metadata: why the answer is degraded
SIGNATURE_DEF_MAP_URL: Final = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
_STATUS: Final = {s.value[0]: s for s in grpc.StatusCode}

_SWEEP_S: Final = 0.05  # how often calls received whole are checked for a client that went away

_Req = TypeVar("_Req", bound=Message)
_Fn = Callable[[Any, bytes, float], Awaitable[tuple[bytes, int | None, str | None]]]


class TensorInputs:
    """Predict inputs that arrived as TensorProtos: forwarded as they are, or read as embedding features.

    ``wire``: the client's serialized PredictRequest when a pass-through model may forward it as it is (no
    ``output_filter``: the gateway applies that one itself), else None. ``raw``: that request whatever its filter
    (default ``wire``), read natively for an embedding model's features when it can be
    (:func:`gateway.native.tensor_features`; else the reference reads ``tensors``)."""

    typed = True

    def __init__(
        self,
        tensors: Mapping[str, tfs_pb2.TensorProto],
        wire: bytes | None = None,
        raw: bytes | None = None,
        fallback: native.FallbackSink | None = None,
    ) -> None:
        self._tensors = tensors
        self.wire = wire
        self._raw = wire if raw is None else raw
        self._fallback = fallback

    def tensors(self, dtypes: Mapping[str, int] | None) -> dict[str, tfs_pb2.TensorProto]:
        return dict(self._tensors)

    def features(self, manifest: Manifest) -> FeatureBatch:
        from gateway.grpc_front.features import batch_from_tensors

        if self._raw is not None:
            fast = native.tensor_features(self._raw, manifest, self._fallback)
            if fast is not None:
                return fast
        return batch_from_tensors(self._tensors, manifest)


def _version_spec(ms: tfs_pb2.ModelSpec) -> VersionSpec:
    choice = ms.WhichOneof("version_choice")
    if choice == "version":
        return VersionSpec(version=ms.version.value)
    if choice == "version_label":
        return VersionSpec(label=ms.version_label)
    return VersionSpec()


def _reply_spec(name: str, version: int | None, signature: str) -> tfs_pb2.ModelSpec:
    out = tfs_pb2.ModelSpec(name=name, signature_name=signature)
    if version is not None:
        out.version.value = version
    return out


def _filtered(
    outputs: Mapping[str, tfs_pb2.TensorProto], wanted: list[str]
) -> Mapping[str, tfs_pb2.TensorProto]:
    """``output_filter``: only the named outputs (TF Serving's check and message for an unknown alias)."""
    if not wanted:
        return outputs
    for name in wanted:
        if name not in outputs:
            raise InvalidArgument(
                f"output tensor alias not found in signature: {clip(name)} Outputs expected to be in the set "
                f"{{{','.join(sorted(outputs))}}}."
            )
    return {name: outputs[name] for name in wanted}


def _classify_reply(name: str, res: ClassifyResult) -> bytes:
    """The serialized ClassificationResponse (pure; on the parse threads for a large request)."""
    resp = tfs_pb2.ClassificationResponse(
        model_spec=_reply_spec(name, res.version, res.signature), result=res.result
    )
    out: bytes = resp.SerializeToString()
    return out


def _regress_reply(name: str, res: RegressResult) -> bytes:
    """The serialized RegressionResponse (pure; on the parse threads for a large request)."""
    resp = tfs_pb2.RegressionResponse(
        model_spec=_reply_spec(name, res.version, res.signature), result=res.result
    )
    out: bytes = resp.SerializeToString()
    return out


def _relayed(wire: bytes, name: str, signature: str) -> bytes:
    """The backend's serialized PredictResponse ``wire`` as the reply :func:`_reply_spec` gives: a ModelSpec with
    the client's model name and ``signature`` appended. A singular message field that occurs twice is merged when
    parsed (protobuf's rule, in every implementation), so clients read the backend's ModelSpec (its version) with
    those two fields replaced; the outputs are the backend's bytes, never decoded or copied field by field."""
    patch: bytes = tfs_pb2.PredictResponse(
        model_spec=tfs_pb2.ModelSpec(name=name, signature_name=signature)
    ).SerializeToString()
    return wire + patch


class _Servicer:
    """The five RPCs; each reads and parses its message (:meth:`_serve`), calls the core once and encodes.

    Two event loops: the gRPC server's own (``grpc_front.server``: its I/O thread, where :meth:`_serve` runs, the
    token is checked, overload refused and the message read) and the gateway's (``core_loop``: uvicorn's, where
    admission, parsing and the gateway core run, shared with REST).
    """

    def __init__(self, rt: Runtime, core_loop: asyncio.AbstractEventLoop) -> None:
        self.rt = rt
        self.core_loop = core_loop
        self._receiving = 0  # calls whose message is being read (on the gRPC loop only)
        # path -> (api label, request message, what answers it): the Python front's handlers and the calls the gate
        # receives whole are both built from this
        self.methods: dict[str, tuple[str, type[Message], _Fn]] = {
            f"/{PREDICTION_SERVICE}/Predict": ("predict", tfs_pb2.PredictRequest, self._predict),
            f"/{PREDICTION_SERVICE}/Classify": ("classify", tfs_pb2.ClassificationRequest, self._classify),
            f"/{PREDICTION_SERVICE}/Regress": ("regress", tfs_pb2.RegressionRequest, self._regress),
            f"/{PREDICTION_SERVICE}/GetModelMetadata": (
                "metadata",
                tfs_pb2.GetModelMetadataRequest,
                self._metadata,
            ),
            f"/{MODEL_SERVICE}/GetModelStatus": ("status", tfs_pb2.GetModelStatusRequest, self._status),
        }

    def deadline(self, left: float | None) -> float:
        """The monotonic deadline of a call with ``left`` seconds to its client's deadline (None: none set)."""
        limit = self.rt.settings.request_timeout_s
        return time.monotonic() + (limit if left is None else min(left, limit))

    def failure(self, api: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
        """The status and text a call ends with when ``exc`` escaped it: a GatewayError's own (backend addresses
        removed), else INTERNAL without internals (our bug; its traceback logged)."""
        if isinstance(exc, GatewayError):
            return _STATUS.get(int(exc.code), grpc.StatusCode.UNKNOWN), public_message(
                exc.message, self.rt.targets
            )
        log.error("unhandled error", exc_info=exc, extra={"path": f"grpc {api}"})
        return grpc.StatusCode.INTERNAL, "Internal error; see the gateway log"

    def take(self, raw: bytes, held: list[int]) -> None:
        """A received message counted, its size reserved in the budget (``held``), its ``model_spec`` sizes checked
        before a byte of it is copied or parsed."""
        self.rt.metrics.grpc_request_bytes.inc(len(raw))
        self._reserve(len(raw), held)
        check_spec_sizes(raw)

    async def _serve(
        self,
        api: str,
        kind: type[_Req],
        context: grpc.aio.ServicerContext,
        fn: Callable[[_Req, bytes, float], Awaitable[tuple[bytes, int | None, str | None]]],
    ) -> bytes:
        """One call: the token, a ``max_in_flight`` slot, the message read and parsed within the limits, then
        ``fn(message, raw, deadline)`` -> (serialized reply, version answered, degraded reason or None).

        Order (each step refuses before the next costs anything): the token is checked from the metadata before a
        byte of the message is read (a caller without one is refused with the message unread, see
        :func:`generic_handlers`); then, while admission would refuse any request (``Admission.saturated``: no slot
        and the queue full, or the gateway's loop lagging), the call is refused here at once, on the gRPC thread, so
        a busy gateway loop never delays a refusal (as it is when ``max_in_flight`` messages are being read at
        once: reason ``receiving``); the message is read only when the buffered-bytes budget has
        room, within ``limits.body_timeout_s``, and its size reserved in the budget shared with REST
        (RESOURCE_EXHAUSTED above ``limits.max_buffered_bytes``). The rest runs on the gateway's loop
        (:meth:`_core`). Errors abort the call with their code; a degraded reason is sent as the trailing metadata
        ``x-embedgate-degraded``.
        """
        rt = self.rt
        deadline = self.deadline(context.time_remaining())
        held = [0]  # bytes reserved in rt.buffered, released at the end
        try:
            with rt.track(admit=False, release=False) as call:
                call.api = api
                authorization = _authorization(context)
                if rt.auth is not None:  # the same bearer tokens as REST, from the `authorization` metadata
                    rt.auth.check(authorization, None)  # several values: refused
                refusal = rt.limiter.refusal_from_thread(self.core_loop)
                if refusal is not None:
                    rt.metrics.rejected.inc()
                    raise refusal
                if self._receiving >= rt.limiter.max_in_flight:  # messages being read: bounded as in flight
                    rt.metrics.rejected.inc()
                    raise rt.limiter.refuse("receiving")
                self._receiving += 1
                try:
                    raw = await self._read(context)
                finally:
                    self._receiving -= 1
                self.take(raw, held)
                work = self._core(call, kind, raw, authorization, deadline, fn)
                resp, degraded = await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(work, self.core_loop)
                )
                if degraded is not None:
                    context.set_trailing_metadata(((DEGRADED_METADATA_KEY, degraded),))
                return resp
        except Exception as exc:  # noqa: BLE001 - every error becomes the call's status
            code, message = self.failure(api, exc)
        finally:
            self._release_held(held)
        await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    def _release_held(self, held: list[int]) -> None:
        """Give back the bytes reserved for a message; after a large one, freed heap pages go back to the OS."""
        rt = self.rt
        if held[0]:
            rt.buffered.release(held[0])
            release_memory_soon(rt.executor, held[0])
            held[0] = 0

    async def _core(
        self,
        call: Call,
        kind: type[_Req],
        raw: bytes,
        authorization: list[str],
        deadline: float,
        fn: Callable[[_Req, bytes, float], Awaitable[tuple[bytes, int | None, str | None]]],
    ) -> tuple[bytes, str | None]:
        """On the gateway's loop: the admission slot (waiting in its queue when none is free; given back here, on
        this loop, when the call ends), the message parsed and checked
        (:func:`~gateway.grpc_front.messages.parse_message`; on a parse worker when large), the token checked for
        its model, what its tensors decode to beyond its size reserved too (given back here), then ``fn``. Large messages run in a
        request scope (``gateway.limits.request_scope``): parsing, planning and encoding go to the parse threads.
        Large is ``limits.offload_bytes``, or ``limits.plain_offload_bytes`` for a plain PredictRequest.
        Returns the reply and the degraded reason (or None); fills in ``call``."""
        rt = self.rt
        ok = False
        extra = [0]  # decoded bytes beyond the message's size, reserved in rt.buffered
        try:
            await call.admit_queued()
            limits = rt.settings.limits
            plain, threshold = offload_threshold(kind, raw, limits)
            with request_scope(limits, rt.executor, len(raw), rt.procs, offload_bytes=threshold):
                parsed = await self._parse(kind, raw, plain)
                call.model = parsed.message.model_spec.name
                if rt.auth is not None:
                    rt.auth.check(authorization, call.model)
                self._reserve(max(0, parsed.decoded_bytes - len(raw)), extra)
                resp, version, degraded = await fn(parsed.message, raw, deadline)
            del raw, parsed
            call.version = "" if version is None else str(version)
            call.degraded = degraded
            ok = True
            return resp, degraded
        finally:
            call.release(ok)
            if extra[0]:
                rt.buffered.release(extra[0])

    def _reserve(self, n: int, held: list[int]) -> None:
        if n:
            try:
                self.rt.buffered.reserve(n)
            except ResourceExhausted:
                self.rt.metrics.rejected.inc()
                raise
            held[0] += n

    async def _read(self, context: grpc.aio.ServicerContext) -> bytes:
        """The request message, unparsed, if the budget has room (its size is only known once gRPC has it all;
        :meth:`take` reserves it)."""
        rt = self.rt
        try:
            rt.buffered.check_room()
        except ResourceExhausted:
            rt.metrics.rejected.inc()
            raise
        body_timeout = rt.settings.limits.body_timeout_s
        reading = asyncio.timeout(body_timeout)
        try:
            async with reading:
                raw = await context.read()
        except TimeoutError:
            if not reading.expired():
                raise
            raise RequestTimeout(body_timeout_text(rt.settings.limits.body_timeout_s)) from None
        if not isinstance(raw, bytes):  # grpc.aio.EOF: the client half-closed without a message
            raise InvalidArgument("The call carries no request message")
        return raw

    async def _parse(self, kind: type[_Req], raw: bytes, plain: bool) -> Parsed[_Req]:
        """``raw`` parsed and checked; a large one is first checked on a parse worker process when there are any
        (a message that does not parse or breaks a limit never holds this process's GIL), then parsed on a parse
        thread. A plain PredictRequest (``gateway.native.plain_predict_request``: numeric tensors only, well-formed,
        so parsing it is a few copies; ``plain``, from :func:`offload_threshold`) skips the worker: its check would cost more than
        the parse it guards."""
        s = self.rt.settings
        procs = parse_pool()
        if procs is not None and not plain:
            await procs.acall(check_message, kind, raw, s.limits, s.max_body_bytes)
        return await offload(parse_message, kind, raw, s.limits, s.max_body_bytes)

    @property
    def _gw(self) -> Gateway:
        if self.rt.gateway is None:
            raise Internal("gateway is not started")
        return self.rt.gateway

    async def _predict(
        self, request: tfs_pb2.PredictRequest, raw: bytes, deadline: float
    ) -> tuple[bytes, int | None, str | None]:
        """Predict: a pass-through model's answer is relayed as the backend serialized it, with the client's
        ModelSpec appended (see :func:`_relayed`); every other answer is built and serialized here."""
        ms = request.model_spec
        wanted = list(request.output_filter)
        inputs = TensorInputs(request.inputs, None if wanted else raw, raw, self.rt.metrics.native_fallback)
        req = PredictRequest(ms.name, _version_spec(ms), ms.signature_name, inputs)
        res = await self._gw.handle(req, deadline)
        if res.wire is not None and not wanted:
            return _relayed(res.wire, ms.name, res.signature), res.version, res.degraded
        outputs = _filtered(res.outputs, wanted)
        resp = tfs_pb2.PredictResponse(model_spec=_reply_spec(ms.name, res.version, res.signature))
        for k, t in outputs.items():
            resp.outputs[k].CopyFrom(t)
        return await offload(resp.SerializeToString), res.version, res.degraded

    async def _classify(
        self, request: tfs_pb2.ClassificationRequest, raw: bytes, deadline: float
    ) -> tuple[bytes, int | None, str | None]:
        ms = request.model_spec
        req = ClassifyRequest(ms.name, _version_spec(ms), ms.signature_name, request.input)
        res = await self._gw.handle(req, deadline)
        wire = await offload(_classify_reply, ms.name, res)
        return wire, res.version, res.degraded

    async def _regress(
        self, request: tfs_pb2.RegressionRequest, raw: bytes, deadline: float
    ) -> tuple[bytes, int | None, str | None]:
        ms = request.model_spec
        req = RegressRequest(ms.name, _version_spec(ms), ms.signature_name, request.input)
        res = await self._gw.handle(req, deadline)
        wire = await offload(_regress_reply, ms.name, res)
        return wire, res.version, res.degraded

    async def _metadata(
        self, request: tfs_pb2.GetModelMetadataRequest, raw: bytes, deadline: float
    ) -> tuple[bytes, int | None, str | None]:
        ms = request.model_spec
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidArgument("GetModelMetadataRequest must specify at least one metadata_field")
        for f in fields:
            if f != "signature_def":
                raise InvalidArgument(f"Metadata field {clip(f)} is not supported")
        res = await self._gw.handle(MetadataRequest(ms.name, _version_spec(ms)), deadline)
        resp = tfs_pb2.GetModelMetadataResponse(model_spec=_reply_spec(ms.name, res.version, ""))
        packed = resp.metadata["signature_def"]
        packed.type_url = SIGNATURE_DEF_MAP_URL
        packed.value = res.signatures.SerializeToString()
        return resp.SerializeToString(), res.version, None

    async def _status(
        self, request: tfs_pb2.GetModelStatusRequest, raw: bytes, deadline: float
    ) -> tuple[bytes, int | None, str | None]:
        ms = request.model_spec
        resp = await self._gw.handle(StatusRequest(ms.name, _version_spec(ms)), deadline)
        return resp.SerializeToString(), None, None


def offload_threshold(kind: type[Message], raw: bytes, limits: LimitsSettings) -> tuple[bool, int]:
    """Whether ``raw`` is a plain PredictRequest (numeric tensors only, well-formed: its parse is a few copies;
    ``gateway.native.plain_predict_request``), and the size from which its request is worked off the loop:
    ``limits.plain_offload_bytes`` if so, else ``limits.offload_bytes``."""
    plain = kind is tfs_pb2.PredictRequest and native.plain_predict_request(raw)
    return plain, limits.plain_offload_bytes if plain else limits.offload_bytes


class DirectCalls:
    """Calls the native gate received whole (``grpc_direct``; ``native/src/direct.rs``), answered on the gateway's
    loop: the same steps as :meth:`_Servicer._serve` after the message is read, without the Python gRPC server.

    The gate has already refused overload (the admission state it is given) and bounded the bytes it holds
    (``limits.max_buffered_bytes``); it receives a message only from a caller whose one ``authorization`` value names
    a token of the tokens file (:meth:`~gateway.auth.Authenticator.tokens`, given to it by the front). Any other
    call arrives here with its message unread (``DirectCall.received`` False) and is refused in the gateway's own
    words (``Auth.check``). A call whose client goes away (it cancels, its deadline passes, the connection drops)
    has its task cancelled within :data:`_SWEEP_S`, as the Python front cancels its handler: the lookups and the
    entry call it made are cancelled too.
    """

    def __init__(self, servicer: _Servicer, tokens_stale: Callable[[], None]) -> None:
        self._s = servicer
        self._tokens_stale = tokens_stale
        self._calls: dict[asyncio.Task[None], Any] = {}  # in flight, with their DirectCall
        self._sweeper: asyncio.Task[None] | None = None
        self.methods = servicer.methods

    def start(self, call: Any, raw: bytes | None) -> None:
        """Serve ``call`` (its message ``raw``, None when withheld) in a task; on the gateway's loop."""
        task = asyncio.ensure_future(self.serve(call, raw))
        self._calls[task] = call
        task.add_done_callback(self._done)
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())

    def _done(self, task: asyncio.Task[None]) -> None:
        self._calls.pop(task, None)

    async def _sweep(self) -> None:
        """While calls are in flight: cancel those whose client has gone."""
        try:
            while self._calls:
                await asyncio.sleep(_SWEEP_S)
                for task, call in list(self._calls.items()):
                    if call.cancelled and not task.done():
                        task.cancel()
        finally:
            self._sweeper = None

    async def serve(self, call: Any, raw: bytes | None) -> None:
        s = self._s
        rt = s.rt
        api, kind, fn = self.methods[call.path]
        deadline = s.deadline(call.time_remaining())
        authorization = [v.decode("latin-1") for k, v in call.metadata() if k == "authorization"]
        held = [0]
        try:
            with rt.track(admit=False, release=False) as tracked:
                tracked.api = api
                if rt.auth is not None:
                    rt.auth.check(authorization, None)  # several values, none, or an unknown token: refused
                if raw is None:  # a token the gate did not know yet (the file was re-read meanwhile)
                    self._tokens_stale()
                    raise Unavailable("The gateway was loading new tokens; retry")
                s.take(raw, held)
                if call.cancelled:
                    raise asyncio.CancelledError
                resp, degraded = await s._core(tracked, kind, raw, authorization, deadline, fn)
            del raw
            trailers = [(DEGRADED_METADATA_KEY, degraded)] if degraded is not None else []
            call.respond(0, "", resp, trailers)
            return
        except asyncio.CancelledError:  # the client went away: no one to answer
            return
        except Exception as exc:  # noqa: BLE001 - every error becomes the call's status
            code, message = s.failure(api, exc)
        finally:
            s._release_held(held)
        call.respond(int(code.value[0]), message)


def body_timeout_text(seconds: float) -> str:
    """The refusal of a message not received within ``limits.body_timeout_s`` (the Python front's and the gate's)."""
    return f"Request message not received within {seconds:g} s (limits.body_timeout_s)"


def _authorization(context: grpc.aio.ServicerContext) -> list[str]:
    """Every ``authorization`` metadata value, in order (several are refused by :meth:`Auth.check`)."""
    return [
        v if isinstance(v, str) else ""
        for k, v in context.invocation_metadata() or ()
        if k == "authorization"
    ]


def _raw_handler(fn: Any) -> grpc.RpcMethodHandler:
    """A handler taking the request message unread and unparsed, and returning a serialized reply.

    Registered as client-streaming: on the wire a unary call is the same, and the handler reads the one message
    itself (``context.read()``), so a call refused first (no token, no slot, no budget) never has its message
    received or parsed; HTTP/2 flow control keeps the client from sending more than a window meanwhile."""
    return grpc.stream_unary_rpc_method_handler(fn)


def direct_calls(
    rt: Runtime, core_loop: asyncio.AbstractEventLoop, tokens_stale: Callable[[], None]
) -> DirectCalls:
    """The same five methods for calls the native gate received whole (see :class:`DirectCalls`)."""
    return DirectCalls(_Servicer(rt, core_loop), tokens_stale)


def generic_handlers(rt: Runtime, core_loop: asyncio.AbstractEventLoop) -> tuple[grpc.GenericRpcHandler, ...]:
    """Handlers for TF Serving's PredictionService and ModelService.GetModelStatus, answered by ``rt``'s gateway
    (whose event loop is ``core_loop``; the handlers run on the gRPC server's)."""
    s = _Servicer(rt, core_loop)
    services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for path, (api, kind, fn) in s.methods.items():
        service, method = path.strip("/").split("/")
        services.setdefault(service, {})[method] = _raw_handler(_handler(s, api, kind, fn))
    return tuple(grpc.method_handlers_generic_handler(name, methods) for name, methods in services.items())


def _handler(
    s: _Servicer, api: str, kind: type[Message], fn: _Fn
) -> Callable[[object, grpc.aio.ServicerContext], Awaitable[bytes]]:
    """The Python front's handler of one method: :meth:`_Servicer._serve` of its message."""

    async def handle(requests: object, context: grpc.aio.ServicerContext) -> bytes:
        return await s._serve(api, kind, context, fn)

    return handle
