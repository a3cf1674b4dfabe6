"""REST bodies <-> the core's typed requests and results (TF Serving's JSON, via ``gateway.codec``).

``parse_*`` turn a raw body into a typed request in TF Serving's check order (JSON, ``signature_name``, then -- inside
the core, after the model is resolved -- ``instances``/``inputs`` and the values); ``*_json`` encode results.

Large bodies with parse worker processes (``gateway.limits.ParsePool``): :func:`check_post` runs in a worker (JSON and
limits, ``signature_name``; classify/regress come back typed), then :class:`ProcessJsonInputs` types the values in a
worker once the model is known (the body is parsed a second time there: parsed documents are not kept across calls).
Only numpy arrays, serialized tensors and typed requests cross the process boundary, never a parsed document.

Typed tensors (plain models) come from the compiled path when ``gateway.native`` answers for the raw body, else from
the reference ``json_tensor.tensors_from_request`` (every error text is the reference's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf import json_format

from gateway import native
from gateway.codec import json_tensor as jt
from gateway.codec.tensor import from_ndarray, to_ndarray
from gateway.core.requests import (
    ClassifyRequest,
    ClassifyResult,
    MetadataResult,
    PredictRequest,
    PredictResult,
    RegressRequest,
    RegressResult,
    VersionSpec,
)
from gateway.errors import checked_name
from gateway.limits import ParsePool, parse_document
from schemas.proto import tfs_pb2

if TYPE_CHECKING:
    from embedgate_native import CheckedBody

    from gateway.features import FeatureBatch
    from schemas.gateway_settings import LimitsSettings
    from schemas.manifest import Manifest

__all__ = [
    "JsonInputs",
    "ProcessJsonInputs",
    "check_post",
    "classify_json",
    "metadata_json",
    "parse_classify_regress",
    "parse_predict",
    "parse_predict_embedding",
    "parse_predict_native",
    "predict_json",
    "regress_json",
    "status_json",
]


class JsonInputs:
    """A parsed predict body (``instances`` or ``inputs``), typed lazily for the model that answers.

    ``format`` is known once :meth:`tensors` or :meth:`features` ran (the response mirrors it).
    """

    typed = False

    def __init__(
        self,
        doc: Mapping[str, Any] | None,
        fast: bool,
        body: bytes | None = None,
        checked: CheckedBody | None = None,
        parsed: tuple[Manifest, FeatureBatch, jt.Format] | None = None,
    ) -> None:
        self._doc = doc
        self._fast = fast  # no JSON booleans in the body: numpy may build numeric tensors (json_tensor docs)
        self._body = body  # the raw body, for the native path (gateway.native); None: reference only
        self._checked = checked  # the body as the native check parsed it (gateway.native.check_predict)
        self._parsed = parsed  # the batch the one native pass read for a manifest (parse_predict_embedding)
        self.format = jt.Format.ROW

    def tensors(self, dtypes: Mapping[str, int] | None) -> dict[str, tfs_pb2.TensorProto]:
        if dtypes is None:
            raise TypeError("JSON inputs need the signature's dtypes (typed is False)")
        if self._checked is not None:
            done = native.checked_tensors(self._checked, dtypes)
        elif self._body is not None:
            done = native.predict_tensors(self._body, dtypes)
        else:
            done = None
        if done is not None:
            arrays, self.format = done
        else:
            arrays, self.format = jt.tensors_from_request(self._document(), dtypes, fast=self._fast)
        return {k: from_ndarray(a, dtypes[k]) for k, a in arrays.items()}

    def features(self, manifest: Manifest) -> FeatureBatch:
        from gateway.features import batch_from_columns, batch_from_instances

        if self._parsed is not None:
            parsed_for, batch, fmt = self._parsed
            if parsed_for is manifest:
                self.format = fmt
                return batch
            # served at another version's manifest: the body is checked; its features read again for this one
            if (again := native.request_features(self._body or b"", manifest)) is not None:
                batch, self.format = again
                return batch
        if self._checked is not None:
            done = native.request_features(self._checked, manifest)
            self._checked = None  # declined: the reference reads the Python document
            if done is not None:
                batch, self.format = done
                return batch
        doc = self._document()
        self.format = jt.check_request_keys(doc)
        if self.format is jt.Format.ROW:
            return batch_from_instances(doc["instances"], manifest)
        return batch_from_columns(doc["inputs"], manifest)

    def _document(self) -> Mapping[str, Any]:
        """The parsed body; parsed here (once) when the native check (:func:`parse_predict_native`) took its place."""
        if self._doc is None:
            self._doc = jt.loads(self._body or b"")
        return self._doc


class ProcessJsonInputs:
    """:class:`JsonInputs` of a large body (already checked by :func:`check_post`), typed in a parse worker process.

    Call :meth:`tensors` / :meth:`features` from a parse thread (``gateway.limits.offload``): they wait for the worker.
    """

    typed = False

    def __init__(self, body: bytes, fast: bool, pool: ParsePool) -> None:
        self._body = body
        self._fast = fast
        self._pool = pool
        self.format = jt.Format.ROW

    def tensors(self, dtypes: Mapping[str, int] | None) -> dict[str, tfs_pb2.TensorProto]:
        if dtypes is None:
            raise TypeError("JSON inputs need the signature's dtypes (typed is False)")
        blobs, self.format = self._pool.call(typed_tensors, self._body, dict(dtypes), self._fast)
        return {k: tfs_pb2.TensorProto.FromString(b) for k, b in blobs.items()}

    def features(self, manifest: Manifest) -> FeatureBatch:
        batch, self.format = self._pool.call(typed_features, self._body, manifest)
        return batch


def check_post(
    api: str, name: str, spec: VersionSpec, body: bytes, limits: LimitsSettings
) -> tuple[str, bool] | ClassifyRequest | RegressRequest:
    """In a parse worker: ``body`` parsed and checked (``parse_document``). Predict: its signature name and whether
    numpy may type it (see :class:`JsonInputs`); classify/regress: the typed request."""
    doc = parse_document(body, limits)
    if api == "predict":
        return _signature(doc), not jt.may_contain_bools(body)
    return parse_classify_regress(api, name, spec, doc)


def _signature(doc: Mapping[str, Any]) -> str:
    """The body's ``signature_name`` ("" when absent); InvalidArgument when it is not a string or is longer than
    any served (``gateway.errors.MAX_NAME_BYTES``, as the native parsers refuse it)."""
    return checked_name("signature_name", jt.signature_name(doc))


def _typed_arrays(
    doc: Mapping[str, Any] | None, body: bytes | None, dtypes: Mapping[str, int], fast: bool
) -> tuple[dict[str, np.ndarray], jt.Format]:
    """The input arrays of a predict body: natively typed from ``body`` when ``gateway.native`` answers, else by the
    reference (``doc``, or ``body`` parsed again when ``doc`` is None) which also words every error."""
    if body is not None and (done := native.predict_tensors(body, dtypes)) is not None:
        return done
    if doc is None:
        doc = jt.loads(body or b"")
    return jt.tensors_from_request(doc, dtypes, fast=fast)


def typed_tensors(body: bytes, dtypes: dict[str, int], fast: bool) -> tuple[dict[str, bytes], jt.Format]:
    """In a parse worker: the serialized TensorProtos of a checked predict body and its format."""
    arrays, fmt = _typed_arrays(None, body, dtypes, fast)
    return {k: from_ndarray(a, dtypes[k]).SerializeToString() for k, a in arrays.items()}, fmt


def typed_features(body: bytes, manifest: Manifest) -> tuple[FeatureBatch, jt.Format]:
    """In a parse worker: the feature batch of a checked predict body and its format (natively parsed when
    ``gateway.native`` answers, else by the reference, which also words every error)."""
    done = native.request_features(body, manifest)
    if done is not None:
        return done
    inputs = JsonInputs(jt.loads(body), fast=False)
    return inputs.features(manifest), inputs.format


def parse_predict(
    name: str, spec: VersionSpec, doc: dict[str, Any], body: bytes
) -> tuple[PredictRequest, JsonInputs]:
    """``doc`` is ``body`` parsed (``gateway.limits.parse_json``: limits checked, off the loop when large)."""
    inputs = JsonInputs(doc, fast=not jt.may_contain_bools(body), body=body)
    return PredictRequest(name, spec, _signature(doc), inputs), inputs


def parse_predict_native(
    name: str, spec: VersionSpec, body: bytes, limits: LimitsSettings
) -> tuple[PredictRequest, JsonInputs] | None:
    """:func:`parse_predict` in one native pass over ``body`` (strict JSON, the limits, ``signature_name``); the
    document is parsed later only if a model needs it (features, or a body the native typing declines). None when
    the native path is off or declines: then ``parse_document`` + :func:`parse_predict` (every error text)."""
    done = native.check_predict(body, limits)
    if done is None:
        return None
    sig, checked = done
    inputs = JsonInputs(None, fast=not jt.may_contain_bools(body), body=body, checked=checked)
    return PredictRequest(name, spec, sig, inputs), inputs


def parse_predict_embedding(
    name: str,
    spec: VersionSpec,
    body: bytes,
    limits: LimitsSettings,
    manifest: Manifest,
    fallback: native.FallbackSink | None = None,
) -> tuple[PredictRequest, JsonInputs] | None:
    """:func:`parse_predict` of an embedding model's body in ONE native pass (``gateway.native.rest_batch``: JSON,
    the limits, ``signature_name`` and the features of ``manifest``, the model's latest manifest, at once). None
    when the native path is off or declines the body: then the usual path runs (``parse_document``, the features
    later), which words every error; ``fallback`` is told when the native pass declines."""
    done = native.rest_batch(body, manifest, limits, fallback)
    if done is None:
        return None
    sig, batch, fmt = done
    inputs = JsonInputs(None, fast=False, body=body, parsed=(manifest, batch, fmt))
    return PredictRequest(name, spec, sig, inputs), inputs


def parse_classify_regress(
    api: str, name: str, spec: VersionSpec, doc: dict[str, Any]
) -> ClassifyRequest | RegressRequest:
    """``doc``: the parsed body (see :func:`parse_predict`); builds the tf.Example Input (call it off the loop)."""
    from gateway.codec.example import input_from_json

    sig = _signature(doc)
    inp = input_from_json(doc, api)
    if api == "classify":
        return ClassifyRequest(name, spec, sig, inp)
    return RegressRequest(name, spec, sig, inp)


def predict_json(result: PredictResult, fmt: jt.Format) -> bytes:
    """TF Serving's predict body for ``result``: written natively (``gateway.native``) unless that path is off or
    declines an output's dtype, then by the reference ``json_tensor.predict_response`` (same bytes, same errors)."""
    outputs = {k: to_ndarray(t) for k, t in result.outputs.items()}
    body = native.predict_response(outputs, fmt)
    return body if body is not None else jt.predict_response(outputs, fmt)


def classify_json(result: ClassifyResult) -> bytes:
    """TF Serving's classify body (native writer when on, else the reference; same bytes)."""
    classes = [[(c.label, c.score) for c in cl.classes] for cl in result.result.classifications]
    body = native.classify_response(classes)
    return body if body is not None else jt.classify_response(classes)


def regress_json(result: RegressResult) -> bytes:
    """TF Serving's regress body (native writer when on, else the reference; same bytes)."""
    values = [r.value for r in result.result.regressions]
    body = native.regress_response(values)
    return body if body is not None else jt.regress_response(values)


def status_json(resp: tfs_pb2.GetModelStatusResponse) -> bytes:
    d = json_format.MessageToDict(resp, always_print_fields_with_no_presence=True)
    return json.dumps(d, indent=4).encode()


def metadata_json(name: str, result: MetadataResult) -> bytes:
    spec = tfs_pb2.ModelSpec(name=name, signature_name="")
    spec.version.value = result.version
    doc = {
        "model_spec": json_format.MessageToDict(
            spec, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        ),
        "metadata": {
            "signature_def": json_format.MessageToDict(
                result.signatures, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        },
    }
    return json.dumps(doc, indent=4).encode()
