"""The gateway core: model names -> servables, and the one method every front end calls.

:meth:`Gateway.handle` takes a typed request (:mod:`gateway.core.requests`) and returns its result; it knows nothing
of JSON, HTTP or the gRPC server. In order it refuses PS signatures (NOT_FOUND), resolves the client's model name
(only configured names resolve, so PS servables are never reachable) and version label (a label the config lists is
resolved here; any other label is passed to the backend in ``ModelSpec.version_label``), calls the servable, and
renames backend servable names in error messages to the client's model name -- in this one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import overload

from gateway.core.requests import (
    ClassifyRequest,
    ClassifyResult,
    MetadataRequest,
    MetadataResult,
    PredictRequest,
    PredictResult,
    RegressRequest,
    RegressResult,
    Request,
    StatusRequest,
    VersionSpec,
)
from gateway.core.servable import Servable, is_hidden_signature
from gateway.errors import GatewayError, InvalidArgument, NotFound, clip
from schemas.proto import tfs_pb2

__all__ = ["Gateway"]

Result = PredictResult | ClassifyResult | RegressResult | MetadataResult | tfs_pb2.GetModelStatusResponse


class Gateway:
    """Model name -> :class:`Servable`. Task-safe within one event loop."""

    def __init__(self, servables: Mapping[str, Servable]) -> None:
        self.servables = dict(servables)

    def _resolve(self, name: str, spec: VersionSpec) -> tuple[Servable, VersionSpec]:
        """The servable and the backend version spec (configured labels become versions)."""
        m = self.servables.get(name)
        if m is None:
            raise NotFound(f"Servable not found for request: {spec.describe(clip(name))}")
        if spec.label is not None:
            if spec.version is not None:
                raise InvalidArgument("A model spec cannot carry both a version and a version label")
            labels = m.config.version_labels
            if spec.label in labels:
                return m, VersionSpec(version=labels[spec.label])
        return m, spec

    @overload
    async def handle(self, req: PredictRequest, deadline: float) -> PredictResult: ...
    @overload
    async def handle(self, req: ClassifyRequest, deadline: float) -> ClassifyResult: ...
    @overload
    async def handle(self, req: RegressRequest, deadline: float) -> RegressResult: ...
    @overload
    async def handle(self, req: StatusRequest, deadline: float) -> tfs_pb2.GetModelStatusResponse: ...
    @overload
    async def handle(self, req: MetadataRequest, deadline: float) -> MetadataResult: ...

    async def handle(self, req: Request, deadline: float) -> Result:
        """Answer ``req`` before ``deadline`` (``time.monotonic()`` seconds); every failure is a GatewayError."""
        if isinstance(req, StatusRequest):
            m = self.servables.get(req.model)
            if m is None:
                raise NotFound(f"Could not find any versions of model {clip(req.model)}")
            spec = req.spec  # TF Serving's status path ignores labels (all versions are listed)
        else:
            if not isinstance(req, MetadataRequest) and is_hidden_signature(req.signature):
                raise NotFound(
                    f'Servable not found for request: {req.spec.describe(clip(req.model))} signature "{clip(req.signature)}"'
                )
            m, spec = self._resolve(req.model, req.spec)
        try:
            match req:
                case PredictRequest():
                    return await m.predict(req.inputs, req.signature, spec, deadline)
                case ClassifyRequest():
                    return await m.classify(req.input, req.signature, spec, deadline)
                case RegressRequest():
                    return await m.regress(req.input, req.signature, spec, deadline)
                case StatusRequest():
                    return await m.status(spec, deadline)
                case MetadataRequest():
                    return await m.metadata(spec, deadline)
        except GatewayError as exc:
            raise m.renamed(exc) from exc.__cause__

    async def ready(self, deadline: float) -> dict[str, str]:
        """Per model: "ok" or the reason it is not ready (every backend must answer GetModelStatus)."""

        async def one(m: Servable) -> str:
            try:
                return "ok" if await m.ready(deadline) else "no AVAILABLE version"
            except GatewayError as exc:
                return f"{exc.code.name}: {m.renamed(exc).message}"

        names = list(self.servables)
        results = await asyncio.gather(*(one(self.servables[n]) for n in names))
        return dict(zip(names, results, strict=True))
