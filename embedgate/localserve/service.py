"""Thin gRPC servicers: parse the model spec, pin a version through the manager, call the servable, encode.

Every :class:`~embedgate.localserve.errors.ServingError` becomes ``context.abort(code, message)`` in one place
(:func:`_call`); messages are cut at 1024 characters + ``...TRUNCATED`` as TF Serving's ``grpc_status_util.cc``
does. Anything else is an INTERNAL error naming the exception.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from embedgate.localserve.errors import ConfigError, InvalidArgumentError, ServingError
from embedgate.localserve.manager import Manager
from embedgate.localserve.model_config import entries_from_proto
from embedgate.localserve.request import parse_predict_request
from embedgate.localserve.servable import Servable

__all__ = ["ModelService", "PredictionService", "add_services"]

_log = logging.getLogger(__name__)
_MESSAGE_LIMIT = 1024
_SIGNATURE_DEF = "signature_def"
_PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
_NO_DEADLINE_S = 10.0 * 365 * 24 * 3600  # a "deadline" further than ten years away is no deadline
T = TypeVar("T")


def _time_left(context: grpc.ServicerContext) -> float | None:
    """Seconds left before the call's deadline; None for a call sent without one (gRPC then reports a remaining
    time near 2**63 seconds, which no session-run timeout in milliseconds can hold)."""
    left = context.time_remaining()
    return None if left is None or left > _NO_DEADLINE_S else max(0.0, left)


# The generated servicer base is untyped (tensorflow_serving ships no types): subclassing Any.
class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):  # type: ignore[misc]
    def __init__(self, manager: Manager, *, tensor_content: bool = False) -> None:
        self._manager = manager
        self._tensor_content = tensor_content

    def Predict(self, request: predict_pb2.PredictRequest | bytes, context: grpc.ServicerContext) -> Any:
        """``request``: the parsed message, or its received bytes (how :func:`add_services` registers it: split by
        ``request.py`` so that large ``tensor_content`` inputs are read in place)."""

        def run() -> predict_pb2.PredictResponse:
            if isinstance(request, bytes):
                parsed, contents = parse_predict_request(request)
            else:
                parsed, contents = request, {}
            return self._with_servable(
                parsed.model_spec,
                lambda s: s.predict(
                    parsed, as_content=self._tensor_content, timeout=_time_left(context), contents=contents
                ),
            )

        return _call(context, run)

    def Classify(
        self, request: classification_pb2.ClassificationRequest, context: grpc.ServicerContext
    ) -> Any:
        return _call(
            context,
            lambda: self._with_servable(
                request.model_spec, lambda s: s.classify(request, timeout=_time_left(context))
            ),
        )

    def Regress(self, request: regression_pb2.RegressionRequest, context: grpc.ServicerContext) -> Any:
        return _call(
            context,
            lambda: self._with_servable(
                request.model_spec, lambda s: s.regress(request, timeout=_time_left(context))
            ),
        )

    def GetModelMetadata(
        self, request: get_model_metadata_pb2.GetModelMetadataRequest, context: grpc.ServicerContext
    ) -> Any:
        def run() -> get_model_metadata_pb2.GetModelMetadataResponse:
            fields = list(request.metadata_field)
            if not fields:
                raise InvalidArgumentError("GetModelMetadataRequest must specify at least one metadata_field")
            for f in fields:
                if f != _SIGNATURE_DEF:
                    raise InvalidArgumentError(f"Metadata field {f} is not supported")

            def metadata(servable: Servable) -> get_model_metadata_pb2.GetModelMetadataResponse:
                response = get_model_metadata_pb2.GetModelMetadataResponse()
                response.model_spec.name = servable.name
                response.model_spec.version.value = servable.version
                packed = any_pb2.Any()
                packed.Pack(servable.signature_def_map())
                response.metadata[_SIGNATURE_DEF].CopyFrom(packed)
                return response

            return self._with_servable(request.model_spec, metadata)

        return _call(context, run)

    def _with_servable(self, spec: Any, fn: Callable[[Servable], T]) -> T:
        version, label = _version_choice(spec)
        with self._manager.handle(spec.name, version, label) as handle:
            return fn(handle.servable)  # type: ignore[arg-type]  # the server's Manager loads only Servables


# The generated servicer base is untyped (tensorflow_serving ships no types): subclassing Any.
class ModelService(model_service_pb2_grpc.ModelServiceServicer):  # type: ignore[misc]
    def __init__(self, manager: Manager, reload: Callable[[], None]) -> None:
        self._manager = manager
        self._reload = reload

    def GetModelStatus(
        self, request: get_model_status_pb2.GetModelStatusRequest, context: grpc.ServicerContext
    ) -> Any:
        def run() -> get_model_status_pb2.GetModelStatusResponse:
            spec = request.model_spec
            if not spec.name:
                raise InvalidArgumentError("Missing model name in request.")
            version, label = _version_choice(spec)
            response = get_model_status_pb2.GetModelStatusResponse()
            for st in self._manager.status(spec.name, version, label):
                mvs = response.model_version_status.add(version=st.version, state=int(st.state))
                mvs.status.SetInParent()  # TF Serving always sets it (error_code OK when the version is fine)
                if st.error:
                    mvs.status.error_code = 2  # tensorflow.error.UNKNOWN
                    mvs.status.error_message = st.error
            return response

        return _call(context, run)

    def HandleReloadConfigRequest(
        self, request: model_management_pb2.ReloadConfigRequest, context: grpc.ServicerContext
    ) -> Any:
        def run() -> model_management_pb2.ReloadConfigResponse:
            try:
                entries = entries_from_proto(request.config)
            except ConfigError as exc:
                raise InvalidArgumentError(str(exc)) from exc
            self._manager.set_models(entries)
            self._reload()
            return model_management_pb2.ReloadConfigResponse()

        return _call(context, run)


def add_services(
    server: grpc.Server, manager: Manager, *, tensor_content: bool, reload: Callable[[], None]
) -> PredictionService:
    """Register the prediction and model services on ``server``; returns the prediction servicer (the native front
    calls its ``Predict`` itself, ``embedgate.localserve.front``)."""
    prediction = PredictionService(manager, tensor_content=tensor_content)
    # Predict takes the received bytes (no request deserializer): registered before the generated handlers, which
    # serve the service's other methods (gRPC asks generic handlers in the order they were added)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                _PREDICTION_SERVICE,
                {
                    "Predict": grpc.unary_unary_rpc_method_handler(
                        prediction.Predict, response_serializer=predict_pb2.PredictResponse.SerializeToString
                    )
                },
            ),
        )
    )
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(prediction, server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(manager, reload), server)
    return prediction


def _version_choice(spec: Any) -> tuple[int | None, str | None]:
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return int(spec.version.value), None
    if choice == "version_label":
        return None, spec.version_label
    return None, None


def _call(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except ServingError as exc:
        context.abort(exc.code, _truncate(exc.message))
    except Exception as exc:  # noqa: BLE001 - the one place a request's unexpected error becomes a status
        _log.exception("request failed")
        context.abort(grpc.StatusCode.INTERNAL, _truncate(f"{type(exc).__name__}: {exc}"))
    raise AssertionError("context.abort returned")  # pragma: no cover


def _truncate(message: str) -> str:
    if len(message) <= _MESSAGE_LIMIT:
        return message
    return message[:_MESSAGE_LIMIT] + "...TRUNCATED"
