"""A plain TF Serving model on one target: requests forwarded, tensors typed from the backend's signature."""

from __future__ import annotations

import grpc

from gateway.backends.client import BackendClient
from gateway.core.metadata import MetadataCache
from gateway.core.modelspec import answered_version, model_spec, read_answer
from gateway.core.requests import (
    ClassifyResult,
    Inputs,
    MetadataResult,
    PredictResult,
    RegressResult,
    VersionSpec,
)
from gateway.core.servable import Servable, StatusClient, available, is_hidden_signature
from gateway.errors import FailedPrecondition, GatewayError, InvalidArgument, clip
from gateway.limits import offload
from schemas.deployment import PassthroughModel
from schemas.proto import tfs_pb2

__all__ = ["DEFAULT_SIGNATURE", "PassthroughServable"]

DEFAULT_SIGNATURE = "serving_default"


class PassthroughServable(Servable):
    """``config.name`` served as ``config.served_name`` by ``client``'s backend.

    Untyped inputs (JSON) are typed with the signature's input dtypes from GetModelMetadata (cached per version;
    re-read when a latest-version call is answered by another version, and once more when the backend rejects
    tensors built from a cached signature). Typed inputs (TensorProtos) are forwarded as they are.
    """

    config: PassthroughModel

    def __init__(self, config: PassthroughModel, client: BackendClient, cache: MetadataCache) -> None:
        self.config = config
        self.name = config.name
        self.served = config.served_name
        self.client = client
        self.cache = cache

    @property
    def front(self) -> StatusClient:
        return self.client

    def served_names(self) -> list[str]:
        return [self.served]

    async def predict(
        self, inputs: Inputs, signature: str, spec: VersionSpec, deadline: float
    ) -> PredictResult:
        if inputs.typed:
            wire = getattr(inputs, "wire", None)
            if isinstance(wire, bytes):
                return await self._forward(wire, signature, spec, deadline)
            return await self._call(inputs.tensors(None), signature, spec, None, deadline)
        try:
            return await self._predict_untyped(inputs, signature, spec, deadline)
        except (InvalidArgument, FailedPrecondition) as exc:
            # The backend rejected tensors built from cached metadata: if the latest version changed meanwhile,
            # refresh the signature and try once more.
            if spec != VersionSpec() or not isinstance(exc.__cause__, grpc.RpcError):
                raise
            before = self.cache.cached_version(self.served, spec)
            self.cache.invalidate(self.served, spec)
            try:
                after, _ = await self.cache.get(self.client, self.served, spec, deadline)
            except GatewayError:
                raise exc from exc.__cause__
            if after == before:
                raise
            return await self._predict_untyped(inputs, signature, spec, deadline)

    async def _predict_untyped(
        self, inputs: Inputs, signature: str, spec: VersionSpec, deadline: float
    ) -> PredictResult:
        used, sigmap = await self.cache.get(self.client, self.served, spec, deadline)
        key = signature or DEFAULT_SIGNATURE
        if key not in sigmap.signature_def:
            raise InvalidArgument(f'Serving signature name: "{clip(key)}" not found in signature def')
        dtypes = {k: v.dtype for k, v in sigmap.signature_def[key].inputs.items()}
        if not dtypes:
            raise InvalidArgument(f"Failed to get input map for signature: {clip(signature) or 'DEFAULT'}")
        return await self._call(await offload(inputs.tensors, dtypes), signature, spec, used, deadline)

    async def _call(
        self,
        tensors: dict[str, tfs_pb2.TensorProto],
        signature: str,
        spec: VersionSpec,
        used: int | None,
        deadline: float,
    ) -> PredictResult:
        req = tfs_pb2.PredictRequest(model_spec=model_spec(self.served, spec, signature))
        for k, t in tensors.items():
            req.inputs[k].CopyFrom(t)
        resp = await self.client.predict(req, deadline)
        answered = answered_version(resp)
        if used is not None and spec == VersionSpec() and answered is not None and answered != used:
            self.cache.invalidate(self.served, spec)
        if answered is None:
            answered = used
        return PredictResult(resp.outputs, answered, resp.model_spec.signature_name or signature)

    async def _forward(
        self, wire: bytes, signature: str, spec: VersionSpec, deadline: float
    ) -> PredictResult:
        """Forward the client's serialized PredictRequest ``wire`` as it is, with the ModelSpec the backend needs
        appended: a ModelSpec occurring twice is merged field by field when parsed (protobuf's rule for a singular
        message field, in every implementation, TF Serving's C++ included), so the backend reads the client's
        ModelSpec with the name replaced by ``served`` and, when ``spec`` resolved a configured label, the version
        set (which clears the label: version and version_label are one oneof). Everything else (inputs,
        signature_name, a label passed through) reaches the backend byte for byte, as with :meth:`_call`. The
        backend's answer is parsed once (its version, and the outputs for a front end that needs them) and kept
        serialized in ``PredictResult.wire`` for a front end that can relay it."""
        patch = tfs_pb2.ModelSpec(name=self.served)
        if spec.version is not None:
            patch.version.value = spec.version
        raw = await self.client.predict_bytes(
            wire + tfs_pb2.PredictRequest(model_spec=patch).SerializeToString(), deadline
        )
        resp, relay = read_answer(raw, "backend")
        return PredictResult(
            resp.outputs, answered_version(resp), resp.model_spec.signature_name or signature, wire=relay
        )

    async def classify(
        self, inp: tfs_pb2.Input, signature: str, spec: VersionSpec, deadline: float
    ) -> ClassifyResult:
        req = tfs_pb2.ClassificationRequest(model_spec=model_spec(self.served, spec, signature), input=inp)
        resp = await self.client.classify(req, deadline)
        return ClassifyResult(
            resp.result, answered_version(resp), resp.model_spec.signature_name or signature
        )

    async def regress(
        self, inp: tfs_pb2.Input, signature: str, spec: VersionSpec, deadline: float
    ) -> RegressResult:
        req = tfs_pb2.RegressionRequest(model_spec=model_spec(self.served, spec, signature), input=inp)
        resp = await self.client.regress(req, deadline)
        return RegressResult(resp.result, answered_version(resp), resp.model_spec.signature_name or signature)

    async def metadata(self, spec: VersionSpec, deadline: float) -> MetadataResult:
        used, sigmap = await self.cache.get(self.client, self.served, spec, deadline, fresh=True)
        visible = tfs_pb2.SignatureDefMap()
        for k, v in sigmap.signature_def.items():
            if not is_hidden_signature(k):
                visible.signature_def[k].CopyFrom(v)
        return MetadataResult(used, visible)

    async def ready(self, deadline: float) -> bool:
        return await available(self.client, self.served, deadline)
