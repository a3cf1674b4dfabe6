"""The gRPC front's Predict replies: relayed as the entry or backend serialized them, or built from their outputs."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final

from gateway.core.requests import PredictResult
from gateway.errors import InvalidArgument, clip
from schemas.proto import tfs_pb2

__all__ = ["DEGRADED_METADATA_KEY", "filtered", "predict_reply", "relayed_reply", "reply_spec"]

DEGRADED_METADATA_KEY: Final = "x-embedgate-degraded"  # trailing metadata: why the answer is degraded


def reply_spec(name: str, version: int | None, signature: str) -> tfs_pb2.ModelSpec:
    """The ``model_spec`` of a reply to a request for model ``name``: the version that answered and ``signature``."""
    out = tfs_pb2.ModelSpec(name=name, signature_name=signature)
    if version is not None:
        out.version.value = version
    return out


def filtered(
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


def relayed_reply(wire: bytes, name: str, signature: str) -> bytes:
    """The backend's serialized PredictResponse ``wire`` as the reply :func:`reply_spec` gives: a ModelSpec with
    the client's model name and ``signature`` appended. A singular message field that occurs twice is merged when
    parsed (protobuf's rule, in every implementation), so clients read the backend's ModelSpec (its version) with
    those two fields replaced; the outputs are the backend's bytes, never decoded or copied field by field."""
    return wire + _spec_patch(name, signature)


@functools.lru_cache(maxsize=256)
def _spec_patch(name: str, signature: str) -> bytes:
    """The serialized ``model_spec`` field :func:`relayed_reply` appends (a few per model: kept)."""
    patch: bytes = tfs_pb2.PredictResponse(
        model_spec=tfs_pb2.ModelSpec(name=name, signature_name=signature)
    ).SerializeToString()
    return patch


def predict_reply(name: str, res: PredictResult, wanted: list[str]) -> tfs_pb2.PredictResponse:
    """The PredictResponse built from ``res``'s outputs (only those of ``output_filter`` ``wanted``, when it names
    any), for a request for model ``name``."""
    resp = tfs_pb2.PredictResponse(model_spec=reply_spec(name, res.version, res.signature))
    for k, t in filtered(res.outputs, wanted).items():
        resp.outputs[k].CopyFrom(t)
    return resp
