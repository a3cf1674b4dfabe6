"""The transport-free gateway core: typed requests in, tensors and protos out (see ``gateway.core.gateway``).

Modules: ``requests`` (typed requests/results, the ``Inputs`` protocol), ``gateway`` (resolution, the one dispatcher,
error renaming), ``servable`` (the servable interface, PS signature hiding), ``passthrough`` and ``embedding`` (the
two kinds of servable), ``metadata`` (signature cache), ``modelspec`` (backend ModelSpecs), ``versions`` (the one
model version an embedding request is served at), ``manifests`` (an embedding model's manifests per version),
``positions`` (which PS replicas are catching up with the stream).
"""

from gateway.core.embedding import EmbeddingServable
from gateway.core.gateway import Gateway
from gateway.core.metadata import MetadataCache
from gateway.core.passthrough import PassthroughServable
from gateway.core.requests import (
    ClassifyRequest,
    ClassifyResult,
    Inputs,
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

__all__ = [
    "ClassifyRequest",
    "ClassifyResult",
    "EmbeddingServable",
    "Gateway",
    "Inputs",
    "MetadataCache",
    "MetadataRequest",
    "MetadataResult",
    "PassthroughServable",
    "PredictRequest",
    "PredictResult",
    "RegressRequest",
    "RegressResult",
    "Request",
    "Servable",
    "StatusRequest",
    "VersionSpec",
    "is_hidden_signature",
]
