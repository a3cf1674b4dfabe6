"""TF Serving's gRPC API over the gateway core: parse the request proto, call ``Gateway.handle`` once, build the reply.

Handlers are registered as generic handlers under TF Serving's service names, so the official
``tensorflow-serving-api`` stubs call them: ``/tensorflow.serving.PredictionService/{Predict, Classify, Regress,
GetModelMetadata}`` and ``/tensorflow.serving.ModelService/GetModelStatus``. Every call goes through the same
``Runtime.track`` as REST (``max_in_flight``, request metrics) and gets the request deadline (``request_timeout_s``,
or the client's gRPC deadline when sooner). A :class:`~gateway.errors.GatewayError` becomes the gRPC status with the
same code and message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

import grpc
from google.protobuf.message import DecodeError

from gateway.core.requests import (
    ClassifyRequest,
    MetadataRequest,
    PredictRequest,
    RegressRequest,
    StatusRequest,
    VersionSpec,
)
from gateway.errors import GatewayError, Internal, InvalidArgument, public_message
from gateway.lifespan import Runtime
from schemas.proto import tfs_pb2

if TYPE_CHECKING:
    from gateway.core.gateway import Gateway
    from gateway.features import FeatureBatch
    from schemas.manifest import Manifest

__all__ = ["DEGRADED_METADATA_KEY", "MODEL_SERVICE", "PREDICTION_SERVICE", "TensorInputs", "generic_handlers"]

log = logging.getLogger("embedgate.gateway")

PREDICTION_SERVICE: Final = "tensorflow.serving.PredictionService"
MODEL_SERVICE: Final = "tensorflow.serving.ModelService"
DEGRADED_METADATA_KEY: Final = "x-embedgate-degraded"  # trailing metadata: why the answer is degraded
SIGNATURE_DEF_MAP_URL: Final = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
_STATUS: Final = {s.value[0]: s for s in grpc.StatusCode}

_Resp = TypeVar("_Resp")


class TensorInputs:
    """Predict inputs that arrived as TensorProtos: forwarded as they are, or read as embedding features.

    ``wire``: the client's serialized PredictRequest when a pass-through model may forward it as it is (no
    ``output_filter``: the gateway applies that one itself), else None."""

    typed = True

    def __init__(self, tensors: Mapping[str, tfs_pb2.TensorProto], wire: bytes | None = None) -> None:
        self._tensors = tensors
        self.wire = wire

    def tensors(self, dtypes: Mapping[str, int] | None) -> dict[str, tfs_pb2.TensorProto]:
        return dict(self._tensors)

    def features(self, manifest: Manifest) -> FeatureBatch:
        from gateway.grpc_front.features import batch_from_tensors

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
                f"output tensor alias not found in signature: {name} Outputs expected to be in the set "
                f"{{{','.join(sorted(outputs))}}}."
            )
    return {name: outputs[name] for name in wanted}


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
    """The five RPCs; each parses, calls the core once and encodes."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def _run(
        self,
        api: str,
        model: str,
        context: grpc.aio.ServicerContext,
        fn: Callable[[float], Awaitable[tuple[_Resp, int | None] | tuple[_Resp, int | None, str | None]]],
    ) -> _Resp:
        """Run ``fn(deadline)`` -> (reply, version answered[, degraded reason]) under ``track``; errors abort the call.

        A degraded reason is sent as the trailing metadata ``x-embedgate-degraded``."""
        rt = self.rt
        left = context.time_remaining()
        timeout = rt.settings.request_timeout_s if left is None else min(left, rt.settings.request_timeout_s)
        deadline = time.monotonic() + timeout
        try:
            with rt.track(admit=False) as call:
                call.api, call.model = api, model
                if rt.auth is not None:  # the same bearer tokens as REST, from the `authorization` metadata
                    auth = dict(context.invocation_metadata() or ()).get("authorization")
                    rt.auth.check(auth if isinstance(auth, str) else None, model)
                await call.admit_queued()
                resp, version, *degraded = await fn(deadline)
                call.version = "" if version is None else str(version)
                if degraded and degraded[0] is not None:
                    call.degraded = degraded[0]
                    context.set_trailing_metadata(((DEGRADED_METADATA_KEY, degraded[0]),))
                return resp
        except GatewayError as exc:
            code = _STATUS.get(int(exc.code), grpc.StatusCode.UNKNOWN)
            message = public_message(exc.message, rt.targets)  # no backend addresses
        except Exception:  # our bug: INTERNAL without internals; traceback logged
            log.exception("unhandled error", extra={"path": f"grpc {api}"})
            code, message = grpc.StatusCode.INTERNAL, "Internal error; see the gateway log"
        await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    @property
    def _gw(self) -> Gateway:
        if self.rt.gateway is None:
            raise Internal("gateway is not started")
        return self.rt.gateway

    async def predict(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Predict, registered with bytes in and out: the request is parsed here (once) and a pass-through model's
        answer is relayed as the backend serialized it, with the client's ModelSpec appended (see
        :func:`_relayed`); every other answer is built and serialized here."""
        try:
            request = tfs_pb2.PredictRequest.FromString(raw)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Cannot parse the PredictRequest message")
            raise AssertionError("unreachable: abort raises") from None  # pragma: no cover
        ms = request.model_spec
        wanted = list(request.output_filter)

        async def go(deadline: float) -> tuple[bytes, int | None, str | None]:
            inputs = TensorInputs(request.inputs, None if wanted else raw)
            req = PredictRequest(ms.name, _version_spec(ms), ms.signature_name, inputs)
            res = await self._gw.handle(req, deadline)
            if res.wire is not None and not wanted:
                return _relayed(res.wire, ms.name, res.signature), res.version, res.degraded
            outputs = _filtered(res.outputs, wanted)
            resp = tfs_pb2.PredictResponse(model_spec=_reply_spec(ms.name, res.version, res.signature))
            for k, t in outputs.items():
                resp.outputs[k].CopyFrom(t)
            return resp.SerializeToString(), res.version, res.degraded

        return await self._run("predict", ms.name, context, go)

    async def classify(
        self, request: tfs_pb2.ClassificationRequest, context: grpc.aio.ServicerContext
    ) -> tfs_pb2.ClassificationResponse:
        ms = request.model_spec

        async def go(deadline: float) -> tuple[tfs_pb2.ClassificationResponse, int | None, str | None]:
            req = ClassifyRequest(ms.name, _version_spec(ms), ms.signature_name, request.input)
            res = await self._gw.handle(req, deadline)
            spec = _reply_spec(ms.name, res.version, res.signature)
            return (
                tfs_pb2.ClassificationResponse(model_spec=spec, result=res.result),
                res.version,
                res.degraded,
            )

        return await self._run("classify", ms.name, context, go)

    async def regress(
        self, request: tfs_pb2.RegressionRequest, context: grpc.aio.ServicerContext
    ) -> tfs_pb2.RegressionResponse:
        ms = request.model_spec

        async def go(deadline: float) -> tuple[tfs_pb2.RegressionResponse, int | None, str | None]:
            req = RegressRequest(ms.name, _version_spec(ms), ms.signature_name, request.input)
            res = await self._gw.handle(req, deadline)
            spec = _reply_spec(ms.name, res.version, res.signature)
            return tfs_pb2.RegressionResponse(model_spec=spec, result=res.result), res.version, res.degraded

        return await self._run("regress", ms.name, context, go)

    async def get_model_metadata(
        self, request: tfs_pb2.GetModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> tfs_pb2.GetModelMetadataResponse:
        ms = request.model_spec

        async def go(deadline: float) -> tuple[tfs_pb2.GetModelMetadataResponse, int | None]:
            fields = list(request.metadata_field)
            if not fields:
                raise InvalidArgument("GetModelMetadataRequest must specify at least one metadata_field")
            for f in fields:
                if f != "signature_def":
                    raise InvalidArgument(f"Metadata field {f} is not supported")
            res = await self._gw.handle(MetadataRequest(ms.name, _version_spec(ms)), deadline)
            resp = tfs_pb2.GetModelMetadataResponse(model_spec=_reply_spec(ms.name, res.version, ""))
            packed = resp.metadata["signature_def"]
            packed.type_url = SIGNATURE_DEF_MAP_URL
            packed.value = res.signatures.SerializeToString()
            return resp, res.version

        return await self._run("metadata", ms.name, context, go)

    async def get_model_status(
        self, request: tfs_pb2.GetModelStatusRequest, context: grpc.aio.ServicerContext
    ) -> tfs_pb2.GetModelStatusResponse:
        ms = request.model_spec

        async def go(deadline: float) -> tuple[tfs_pb2.GetModelStatusResponse, int | None]:
            resp = await self._gw.handle(StatusRequest(ms.name, _version_spec(ms)), deadline)
            return resp, None

        return await self._run("status", ms.name, context, go)


def _unary(fn: Any, req: Any, resp: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
    )


def _unary_bytes(fn: Any) -> grpc.RpcMethodHandler:
    """A handler that takes and returns serialized messages (it parses and serializes them itself)."""
    return grpc.unary_unary_rpc_method_handler(fn)


def generic_handlers(rt: Runtime) -> tuple[grpc.GenericRpcHandler, ...]:
    """Handlers for TF Serving's PredictionService and ModelService.GetModelStatus, answered by ``rt``'s gateway."""
    s = _Servicer(rt)
    prediction = grpc.method_handlers_generic_handler(
        PREDICTION_SERVICE,
        {
            "Predict": _unary_bytes(s.predict),
            "Classify": _unary(s.classify, tfs_pb2.ClassificationRequest, tfs_pb2.ClassificationResponse),
            "Regress": _unary(s.regress, tfs_pb2.RegressionRequest, tfs_pb2.RegressionResponse),
            "GetModelMetadata": _unary(
                s.get_model_metadata, tfs_pb2.GetModelMetadataRequest, tfs_pb2.GetModelMetadataResponse
            ),
        },
    )
    model = grpc.method_handlers_generic_handler(
        MODEL_SERVICE,
        {
            "GetModelStatus": _unary(
                s.get_model_status, tfs_pb2.GetModelStatusRequest, tfs_pb2.GetModelStatusResponse
            )
        },
    )
    return prediction, model
