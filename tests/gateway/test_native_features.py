"""Native REST feature parsing (``gateway.native.request_features``, ``native/src/features.rs``) vs the reference
``gateway.features.batch_from_instances`` / ``batch_from_columns``.

Bodies are drawn from well-formed row and columnar requests of a manifest with single and multi features, weights
(present in all, some or no examples), ``max_ids``, ``mask_zero`` padding, an integer lookup layer and dense
features of dim 1 and 3, half of them with one defect (odd leaves: bools, nulls, strings, floats as ids, ids beyond
int64, ``-0``, values beyond float32/double, NaN/Infinity tokens; wrong lengths, missing, unknown or wrapped keys,
``b64`` examples, both or neither of ``instances``/``inputs``). For every body:

* when the native parser answers, its batch and format equal the reference's bit for bit (dtypes, shapes, bytes,
  ``weights is None`` alike), from the body ``check_predict`` parsed and from the raw body;
* when it declines, the reference either raises ``InvalidArgument`` or the body is in a form the native parser
  leaves to it (``b64`` examples, NaN/Infinity tokens, a ``-0``/``-0.0`` literal, a columnar batch of 0 examples).

And through the REST codec (``JsonInputs.features``, ``typed_features``): same batch, same format, same error text.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.codec import json_tensor as jt
from gateway.core.requests import VersionSpec
from gateway.errors import InvalidArgument
from gateway.features import FeatureBatch, batch_from_columns, batch_from_instances
from gateway.lookup_mapping import LookupKind, LookupMapping, attach_lookups, detach_lookups
from gateway.routes.rest_codec import parse_predict_native, typed_features
from schemas.gateway_settings import LimitsSettings
from schemas.manifest import Manifest
from schemas.proto import tfs_pb2
from tests.gateway.feature_cases import ODD, defect, manifest_doc
from tests.support.native import native_mode

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._module(), "FeatureLayout"),
    reason="embedgate_native with the feature parser is not built (make install)",
)


def _manifest() -> Manifest:
    """feature_cases' manifest with a ``mask_zero`` history and a dense feature of dim 3."""
    doc = manifest_doc()
    doc["sparse_features"][2]["mask_zero"] = True
    doc["dense_features"][1]["dim"] = 3
    return Manifest.model_validate(doc)


MANIFEST = _manifest()
LIMITS = LimitsSettings()

_ID = st.integers(-(2**63), 2**63 - 1) | st.integers(0, 9)
_WEIGHT = (
    st.floats(-4, 4, width=32) | st.integers(-3, 3) | st.sampled_from([3.4028235e38, 3.40282357e38, 1e-46])
)
_DENSE = (
    st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([1e39, -3.5e38, 5e-324, 2**53 + 1, 10**300])
)
_MINUS_ZERO = b"-0"  # a JSON literal the reference reads as the int 0 and serde_json as -0.0


@st.composite
def _example(draw: st.DrawFn, weights: dict[str, bool]) -> dict[str, Any]:
    genres = draw(st.lists(_ID, max_size=5))
    if draw(st.booleans()):
        genres = [*genres, *[0] * draw(st.integers(1, 3))][:5]  # padded the way Keras input is
    ex: dict[str, Any] = {
        "user": draw(_ID | st.lists(_ID, min_size=1, max_size=1)),
        "item": draw(_ID),
        "genres": genres,
        "tags": draw(st.lists(_ID, max_size=6)),
        "age": draw(_DENSE | st.lists(_DENSE, min_size=1, max_size=1)),
        "ctx": draw(st.lists(_DENSE, min_size=3, max_size=3)),
    }
    if weights["item_w"] and draw(st.booleans() if weights["some"] else st.just(True)):
        ex["item_w"] = draw(_WEIGHT | st.lists(_WEIGHT, min_size=1, max_size=1))
    if weights["genres_w"] and draw(st.booleans() if weights["some"] else st.just(True)):
        ex["genres_w"] = draw(st.lists(_WEIGHT, min_size=len(genres), max_size=len(genres)))
    return ex


_B64 = {"b64": base64.b64encode(tfs_pb2.Example().SerializeToString()).decode()}


@st.composite
def _body(draw: st.DrawFn) -> bytes:
    """A predict body: rows or columns of generated examples, maybe with one defect somewhere."""
    weights = {"item_w": draw(st.booleans()), "genres_w": draw(st.booleans()), "some": draw(st.booleans())}
    rows = draw(st.lists(_example(weights), min_size=1, max_size=5))
    columnar = draw(st.booleans())
    kind = draw(st.sampled_from(["none", "none", "none", "value", "b64", "keys", "empty"]))
    if kind == "value":
        defect(draw, rows[draw(st.integers(0, len(rows) - 1))], ODD)
    if columnar:
        names = sorted({k for r in rows for k in r})
        inputs: Any = {k: [r[k] for r in rows if k in r] for k in names}
        if kind == "empty":
            inputs = {k: [] for k in names}
        doc: dict[str, Any] = {"inputs": inputs}
    else:
        if kind == "b64":
            rows[draw(st.integers(0, len(rows) - 1))] = _B64
        doc = {"instances": [] if kind == "empty" else rows}
    if kind == "keys":
        doc = draw(st.sampled_from([{}, {**doc, "inputs": {}, "instances": rows}, {"instances": rows[0]}]))
    if draw(st.booleans()):
        doc["signature_name"] = "serving_default"
    text = json.dumps(doc).encode()
    if draw(st.integers(0, 9)) == 0:
        text = text.replace(b" 0,", b" -0,", 1).replace(b" 0]", b" -0]", 1)
    return text


def _reference(body: bytes, manifest: Manifest) -> tuple[FeatureBatch, jt.Format] | str:
    try:
        doc = jt.loads(body)
        fmt = jt.check_request_keys(doc)
        if fmt is jt.Format.ROW:
            return batch_from_instances(doc["instances"], manifest), fmt
        return batch_from_columns(doc["inputs"], manifest), fmt
    except InvalidArgument as exc:
        return f"{exc.code.name}: {exc.message}"


def _native(body: bytes, manifest: Manifest) -> tuple[FeatureBatch, jt.Format] | None:
    """The natively parsed batch (from the checked body); the raw-body entry must agree with it."""
    checked = native.check_predict(body, LIMITS)
    from_checked = None if checked is None else native.request_features(checked[1], manifest)
    from_body = native.request_features(body, manifest)
    if checked is not None:
        assert (from_checked is None) == (from_body is None)
    if from_checked is not None and from_body is not None:
        _same(from_checked, from_body)
    return from_checked if checked is not None else from_body


def _bits(a: np.ndarray | None) -> tuple[str, tuple[int, ...], bytes] | None:
    return None if a is None else (a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())


def _same(a: tuple[FeatureBatch, jt.Format], b: tuple[FeatureBatch, jt.Format]) -> None:
    (x, fx), (y, fy) = a, b
    assert fx is fy
    assert x.size == y.size
    assert list(x.sparse) == list(y.sparse)
    for name, s in x.sparse.items():
        t = y.sparse[name]
        assert _bits(s.ids) == _bits(t.ids), name
        assert _bits(s.row_splits) == _bits(t.row_splits), name
        assert _bits(s.weights) == _bits(t.weights), name
    assert list(x.dense) == list(y.dense)
    for name, d in x.dense.items():
        assert _bits(d) == _bits(y.dense[name]), name


def _declined_form(body: bytes) -> bool:
    """Forms the native parser leaves to the reference even when they are valid."""
    if b'"b64"' in body or b"NaN" in body or b"Infinity" in body or b"-0" in body:
        return True
    doc = json.loads(body)
    inputs = doc.get("inputs") if "instances" not in doc else None
    return isinstance(inputs, dict) and all(v == [] for v in inputs.values())


def _check(body: bytes, manifest: Manifest) -> bool:
    """Asserts native and reference agree on ``body``; True when the native parser answered."""
    ref = _reference(body, manifest)
    with native_mode("auto"):
        got = _native(body, manifest)
    if got is not None:
        assert not isinstance(ref, str), (body, ref)
        _same(got, ref)
        return True
    assert isinstance(ref, str) or _declined_form(body), body
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_body())
def test_native_features_equal_the_reference_or_decline(body: bytes) -> None:
    _check(body, MANIFEST)


@settings(max_examples=60, deadline=None)
@given(_body(), st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True))
def test_integer_lookup_features_are_mapped_as_the_reference_maps_them(body: bytes, vocab: list[int]) -> None:
    mapping = LookupMapping("tags", LookupKind.INTEGER, "tags_lookup", np.array(sorted(vocab), np.int64))
    attach_lookups(MANIFEST, {"tags": mapping})
    try:
        _check(body, MANIFEST)
    finally:
        detach_lookups(MANIFEST)


def _plain(rows: list[dict[str, Any]], columnar: bool) -> bytes:
    if columnar:
        return json.dumps({"inputs": {k: [r[k] for r in rows] for k in rows[0]}}).encode()
    return json.dumps({"instances": rows}).encode()


_ROWS = [
    {
        "user": 1,
        "item": 7,
        "item_w": 0.5,
        "genres": [3, 4, 0, 0],
        "tags": [],
        "age": 31,
        "ctx": [0.1, 2, -3.5],
    },
    {
        "user": [2],
        "item": -9,
        "item_w": [2],
        "genres": [],
        "tags": [5, 6, 7],
        "age": [1.5],
        "ctx": [1e39, 0, 1],
    },
]


@pytest.mark.parametrize("columnar", [False, True])
def test_plain_bodies_are_parsed_natively(columnar: bool) -> None:
    body = _plain(_ROWS, columnar)
    assert _check(body, MANIFEST)  # the native parser answered, and equals the reference
    with native_mode("auto"):
        batch, _ = native.request_features(body, MANIFEST) or pytest.fail("declined")
    assert batch.sparse["genres"].ids.tolist() == [3, 4]  # padding of the mask_zero feature dropped
    assert batch.sparse["genres"].row_splits.tolist() == [0, 2, 2]
    assert batch.sparse["item"].weights is not None and batch.sparse["genres"].weights is None
    assert batch.dense["ctx"][1, 0] == np.inf  # beyond float32, as TF Serving narrows DT_FLOAT
    with native_mode("off"):
        assert native.request_features(body, MANIFEST) is None


def test_weights_sent_by_some_examples_default_to_one() -> None:
    rows = [dict(_ROWS[0], genres=[3, 4], genres_w=[0.5, 2]), dict(_ROWS[1], genres=[8])]
    for r in rows:
        r.pop("item_w")
    assert _check(_plain(rows, False), MANIFEST)
    with native_mode("auto"):
        batch, _ = native.request_features(_plain(rows, False), MANIFEST) or pytest.fail("declined")
    assert batch.sparse["item"].weights is None
    assert batch.sparse["genres"].weights is not None
    assert batch.sparse["genres"].weights.tolist() == [0.5, 2.0, 1.0]


def test_models_with_string_features_stay_on_the_reference() -> None:
    mapping = LookupMapping("tags", LookupKind.STRING, "tags_lookup", np.array([1, 2], np.int64))
    attach_lookups(MANIFEST, {"tags": mapping})
    try:
        with native_mode("auto"):
            assert native.request_features(_plain(_ROWS, False), MANIFEST) is None
    finally:
        detach_lookups(MANIFEST)


@pytest.mark.parametrize("columnar", [False, True])
def test_rest_codec_uses_the_native_batch_and_keeps_the_reference_errors(columnar: bool) -> None:
    good = _plain(_ROWS, columnar)
    bad = good.replace(b'"user": 1', b'"user": true').replace(b'"user": [1', b'"user": [true')
    assert bad != good
    for body in (good, bad):
        ref = _reference(body, MANIFEST)
        with native_mode("auto"):
            parsed = parse_predict_native("m", VersionSpec(), body, LIMITS)
            assert parsed is not None
            inputs = parsed[1]
            try:
                got: tuple[FeatureBatch, jt.Format] | str = (inputs.features(MANIFEST), inputs.format)
            except InvalidArgument as exc:
                got = f"{exc.code.name}: {exc.message}"
            try:
                worker: tuple[FeatureBatch, jt.Format] | str = typed_features(body, MANIFEST)
            except InvalidArgument as exc:
                worker = f"{exc.code.name}: {exc.message}"
        if isinstance(ref, str):
            assert got == worker == ref
        else:
            assert not isinstance(got, str) and not isinstance(worker, str)
            _same(got, ref)
            _same(worker, ref)


_FULL = '"item": 7, "genres": [3], "tags": [], "age": 1, "ctx": [1, 2, 3]'


@pytest.mark.parametrize(
    "body",
    [
        '{"instances": [{"user": 1, "user": 2, '
        + _FULL
        + "}]}",  # duplicate key: the last wins on both paths
        '{"instances": [{"user": 1, ' + _FULL + '}], "instances": [{"user": 5, ' + _FULL + "}]}",
        '{"inputs": {"user": [1], "item": [7], "genres": [[3]], "tags": [[]], "age": [1], "ctx": [[1, 2, 3]]}}',
        (
            '{"inputs": {"user": [1], "item": [7], "genres": [[3]], "tags": [[]], "age": [1], "ctx": [[1, 2, 3]], '
            '"item_w": [0.5], "genres_w": [[2]]}}'
        ),
        '{"instances": [{"user": 123456789012345678901234567890, ' + _FULL + "}]}",
        (
            '{"instances": [{"user": 1, "item": 7, "genres": [3], "tags": [], "age": 123456789012345678901234567, '
            '"ctx": [1e-400, 1.00000000000000011102230246251565404236316680908203125, 3.4028235677973366e38]}]}'
        ),
        '{"instances": [{"user": 1, '
        + _FULL
        + ', "item_w": 3.4028235677973366e38}]}',  # the midpoint: rounds to inf, an error
        '{"instances": [{"user": 1, '
        + _FULL
        + ', "item_w": 3.4028235e38}]}',  # beyond float32 max, rounds to it
        '{"instances": [{"user": 1, ' + _FULL + ', "genres_w": [1, 2]}]}',  # one weight per id
        '{"instances": [{"user": 1, ' + _FULL + ', "genres_w": 1}]}',
        '{"instances": [{"user": 1, "item": 7, "genres": [1, 2, 3, 4, 5, 6], "tags": [], "age": 1, "ctx": [1, 2, 3]}]}',
        '{"instances": [{"user": 1, ' + _FULL + '}], "signature_name": 5}',
        '{"instances": [{"user": "\\ud800", ' + _FULL + "}]}",
        '{"instances": [{"user": 1, ' + _FULL + "}]} x",
        '{"instances": [{"user": NaN, ' + _FULL + "}]}",
    ],
)
def test_hostile_bodies_agree_with_the_reference(body: str) -> None:
    _check(body.encode(), MANIFEST)
