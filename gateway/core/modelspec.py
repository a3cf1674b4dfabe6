"""ModelSpecs sent to backends, and the version a backend says answered."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from gateway.core.requests import VersionSpec
from gateway.errors import Internal
from schemas.proto import tfs_pb2

__all__ = ["answered_version", "model_spec", "read_answer"]


def model_spec(served: str, spec: VersionSpec, signature: str = "") -> tfs_pb2.ModelSpec:
    """``ModelSpec`` for the backend servable ``served``: the version, or the label passed through, or neither."""
    out = tfs_pb2.ModelSpec(name=served, signature_name=signature)
    if spec.version is not None:
        out.version.value = spec.version
    elif spec.label is not None:
        out.version_label = spec.label
    return out


def answered_version(resp: Any) -> int | None:
    """``resp.model_spec.version`` when the backend set it (TF Serving always does), else None."""
    ms = resp.model_spec
    return int(ms.version.value) if ms.HasField("version") else None


def read_answer(raw: bytes, who: str) -> tuple[tfs_pb2.PredictResponse, bytes | None]:
    """A backend's serialized PredictResponse ``raw`` parsed (``Internal`` naming ``who`` when it does not parse),
    and ``raw`` again when a front end may relay it as it is: unless the backend named a version label (a built
    reply carries none)."""
    try:
        resp = tfs_pb2.PredictResponse.FromString(raw)
    except DecodeError as exc:
        raise Internal(f"{who} sent an unreadable PredictResponse: {exc}") from None
    relay = raw if resp.model_spec.WhichOneof("version_choice") != "version_label" else None
    return resp, relay
