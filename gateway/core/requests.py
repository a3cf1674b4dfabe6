"""Typed requests and results of the gateway core: what a front end (REST, gRPC) parses into and encodes from.

A front end builds one of the ``*Request`` dataclasses, calls :meth:`gateway.core.Gateway.handle` and encodes the
matching ``*Result``. Nothing here knows JSON or HTTP: predict inputs arrive behind the :class:`Inputs` protocol,
which each front end implements (JSON values, or TensorProtos), and the core asks it for what the model needs --
TensorProtos for a pass-through model (given the signature's dtypes), a :class:`~gateway.features.FeatureBatch` for
an embedding model. Results carry protos as the backends answered them (tensors stay TensorProtos).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from schemas.proto import tfs_pb2

if TYPE_CHECKING:  # gateway.features is imported lazily: pass-through-only gateways never load it
    from gateway.features import FeatureBatch
    from schemas.manifest import Manifest

__all__ = [
    "ClassifyRequest",
    "ClassifyResult",
    "Inputs",
    "MetadataRequest",
    "MetadataResult",
    "PredictRequest",
    "PredictResult",
    "RegressRequest",
    "RegressResult",
    "Request",
    "StatusRequest",
    "VersionSpec",
]


@dataclass(frozen=True)
class VersionSpec:
    """Which version the client asked for: nothing (latest), a number, or a label (never both)."""

    version: int | None = None
    label: str | None = None

    def describe(self, name: str) -> str:
        """TF Serving's ``ServableRequest`` text: ``Specific(m, 3)`` or ``Latest(m)``."""
        return f"Specific({name}, {self.version})" if self.version is not None else f"Latest({name})"


class Inputs(Protocol):
    """Predict inputs as a front end parsed them; the core asks for the form the model needs.

    Methods raise :class:`gateway.errors.InvalidArgument` (naming the input or feature) for bad client values.
    """

    @property
    def typed(self) -> bool:
        """True when the inputs carry their own dtypes (TensorProtos): a pass-through model then needs no signature
        lookup and the backend validates them; False when :meth:`tensors` needs the signature's dtypes."""
        ...

    def tensors(self, dtypes: Mapping[str, int] | None) -> dict[str, tfs_pb2.TensorProto]:
        """Inputs of a pass-through model; ``dtypes`` maps the signature's inputs to DataTypes (None when typed)."""
        ...

    def features(self, manifest: Manifest) -> FeatureBatch:
        """The validated feature batch of an embedding model described by ``manifest``."""
        ...


@dataclass(frozen=True, eq=False)
class PredictRequest:
    model: str  # the client-facing model name
    spec: VersionSpec
    signature: str  # "" = the model's default
    inputs: Inputs


@dataclass(frozen=True, eq=False)
class ClassifyRequest:
    model: str
    spec: VersionSpec
    signature: str
    input: tfs_pb2.Input


@dataclass(frozen=True, eq=False)
class RegressRequest:
    model: str
    spec: VersionSpec
    signature: str
    input: tfs_pb2.Input


@dataclass(frozen=True)
class StatusRequest:
    model: str
    spec: VersionSpec  # labels are ignored, as in TF Serving's status path


@dataclass(frozen=True)
class MetadataRequest:
    model: str
    spec: VersionSpec


Request = PredictRequest | ClassifyRequest | RegressRequest | StatusRequest | MetadataRequest


@dataclass(frozen=True, eq=False)
class PredictResult:
    """Output tensors as the backend sent them; ``version`` answered (None when the backend did not say).

    ``degraded`` (also on the classify/regress results): a short reason when the answer could not be served at one
    consistent model version as asked (e.g. ``version_fallback``), None otherwise.
    """

    outputs: Mapping[str, tfs_pb2.TensorProto]
    version: int | None
    signature: str
    degraded: str | None = (
        None  # why the answer is degraded (front ends send it as X-Embedgate-Degraded); None: not
    )
    # The backend's serialized PredictResponse when the request was forwarded as bytes (a pass-through model's
    # inputs with ``wire`` set, see gateway.core.passthrough); its model_spec names the backend's servable.
    wire: bytes | None = None


@dataclass(frozen=True, eq=False)
class ClassifyResult:
    result: tfs_pb2.ClassificationResult
    version: int | None
    signature: str
    degraded: str | None = None


@dataclass(frozen=True, eq=False)
class RegressResult:
    result: tfs_pb2.RegressionResult
    version: int | None
    signature: str
    degraded: str | None = None


@dataclass(frozen=True, eq=False)
class MetadataResult:
    """The resolved version and the signatures clients may see (PS signatures removed)."""

    version: int
    signatures: tfs_pb2.SignatureDefMap
