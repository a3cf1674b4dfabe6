"""The one-pass native REST body parser (``gateway.native.rest_batch``, ``native/src/rest_body.rs``) vs the reference
``gateway.limits.parse_document`` + ``gateway.features.batch_from_instances`` / ``batch_from_columns``.

Bodies come from ``test_native_features``' generator (well-formed row and columnar requests of a manifest with single
and multi features, weights, ``max_ids``, ``mask_zero`` padding, dense features of dim 1 and 3; half with one defect),
checked under the default limits and under small drawn ones (depth, batch size, per-example lists), plus hostile
texts (surrogates, control characters, trailing bytes, bad numbers, duplicate keys, deep nesting). For every body:

* when the native pass answers, the reference accepts the body under the same limits, and the batch, format and
  ``signature_name`` are the reference's bit for bit;
* when it declines, the reference refuses the body (an error text) or the body is in a form left to it (``b64``,
  NaN/Infinity, ``-0``, an empty columnar batch, a duplicate key);
* through the REST route's codec (``parse_predict_embedding`` then ``JsonInputs.features``, else the usual path),
  the same batch or the same error text as with ``EMBEDGATE_NATIVE=off``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.codec import json_tensor as jt
from gateway.core.requests import VersionSpec
from gateway.errors import MAX_NAME_BYTES, GatewayError
from gateway.features import FeatureBatch, batch_from_columns, batch_from_instances
from gateway.limits import parse_document
from gateway.routes.rest_codec import _signature, parse_predict, parse_predict_embedding
from schemas.gateway_settings import LimitsSettings
from schemas.manifest import Manifest
from tests.gateway.test_native_features import _FULL, _ROWS, MANIFEST, _body, _declined_form, _plain, _same
from tests.support.native import native_mode

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._module(), "rest_features"),
    reason="embedgate_native with the one-pass REST parser is not built (make install)",
)

LIMITS = LimitsSettings()

Reference = tuple[str, FeatureBatch, jt.Format] | str


def _reference(body: bytes, limits: LimitsSettings, manifest: Manifest = MANIFEST) -> Reference:
    """What the reference route makes of ``body``: (signature name, batch, format), or the error text."""
    try:
        doc = parse_document(body, limits)
        sig = jt.signature_name(doc)
        fmt = jt.check_request_keys(doc)
        if fmt is jt.Format.ROW:
            return sig, batch_from_instances(doc["instances"], manifest), fmt
        return sig, batch_from_columns(doc["inputs"], manifest), fmt
    except GatewayError as exc:
        return f"{exc.code.name}: {exc.message}"


def _has_duplicate_key(body: bytes) -> bool:
    seen: list[bool] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen.append(len({k for k, _ in pairs}) != len(pairs))
        return dict(pairs)

    try:
        json.loads(body, object_pairs_hook=hook)
    except ValueError:
        return False
    return any(seen)


def _check(body: bytes, limits: LimitsSettings = LIMITS) -> bool:
    """Asserts the one pass and the reference agree on ``body``; True when the native pass answered."""
    ref = _reference(body, limits)
    with native_mode("auto"):
        got = native.rest_batch(body, MANIFEST, limits)
    if got is not None:
        assert not isinstance(ref, str), (body, ref)
        assert got[0] == ref[0]
        _same(got[1:], ref[1:])
        return True
    assert isinstance(ref, str) or _declined_form(body) or _has_duplicate_key(body), body
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_body())
def test_one_pass_equals_the_reference_or_declines(body: bytes) -> None:
    _check(body)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_body(), st.integers(2, 5), st.integers(1, 6), st.integers(1, 6))
def test_limits_are_enforced_while_parsing(body: bytes, depth: int, instances: int, ids: int) -> None:
    limits = LimitsSettings(max_json_depth=depth, max_instances=instances, max_ids_per_feature=ids)
    _check(body, limits)


def test_plain_bodies_take_the_one_pass() -> None:
    for columnar in (False, True):
        assert _check(_plain(_ROWS, columnar))
    with native_mode("off"):
        assert native.rest_batch(_plain(_ROWS, False), MANIFEST, LIMITS) is None


def test_limits_decline_where_the_reference_refuses() -> None:
    body = _plain(_ROWS, False)  # 2 examples, lists of 3 (ctx), depth 4
    for limits in (
        LimitsSettings(max_instances=1),
        LimitsSettings(max_ids_per_feature=2),
        LimitsSettings(max_json_depth=3),
    ):
        with native_mode("auto"):
            assert native.rest_batch(body, MANIFEST, limits) is None
        assert isinstance(_reference(body, limits), str)


_ROW = '{"user": 1, ' + _FULL + "}"


@pytest.mark.parametrize(
    "body",
    [
        '{"instances": [' + _ROW + '], "signature_name": "a\\u00e9\\ud83d\\ude00\\n"}',
        '{"instances": [' + _ROW + '], "signature_name": "\\ud800"}',
        '{"instances": [' + _ROW + '], "signature_name": "\\udc00x"}',
        '{"instances": [' + _ROW + '], "signature_name": "a\tb"}',
        '{"instances": [' + _ROW + '], "signature_name": "\xff"}',
        '{"instances": [' + _ROW + '], "signature_name": "x", "signature_name": "y"}',
        '{"instances": [' + _ROW + "]}  \n",
        '{"instances": [' + _ROW + "]} {}",
        '{"instances": [' + _ROW + "],}",
        '{"instances": [' + _ROW + ",]}",
        '{"instances": [{"user": 01, ' + _FULL + "}]}",
        '{"instances": [{"user": 1.0, ' + _FULL + "}]}",
        '{"instances": [{"user": 1e2, ' + _FULL + "}]}",
        '{"instances": [{"user": -, ' + _FULL + "}]}",
        '{"instances": [{"user": 9223372036854775807, ' + _FULL + "}]}",
        '{"instances": [{"user": -9223372036854775808, ' + _FULL + "}]}",
        '{"instances": [{"user": 9223372036854775808, ' + _FULL + "}]}",
        '{"instances": [{"user": 1, "item": 7, "genres": [3], "tags": [], "age": -0.0, "ctx": [1.5e-45, 2., 3]}]}',
        '{"instances": [{"user": 1, "item": 7, "genres": [3], "tags": [], "age": 1e400, "ctx": [1, 2, 3]}]}',
        '{"instances": [{"user": 1, "item": 7, "genres": [3], "tags": [], "age": 1E+2, "ctx": [-1e-2, 2, 3]}]}',
        (
            '{"instances": [{"user": 1, "item": 7, "genres": [3], "tags": [], "age": 18446744073709551617, '
            '"ctx": [99999999999999999999, -9223372036854775809, 3]}]}'
        ),
        '{"instances": [{"us\\u0065r": 1, ' + _FULL + "}]}",
        '{"instances": [{"user": [[1]], ' + _FULL + "}]}",
        (
            '{"instances": [{"ctx": [1, 2, 3], "age": 1, "tags": [], "genres_w": [0.5], "genres": [3], '
            '"item_w": 2, "item": 7, "user": 1}]}'
        ),
        (
            '{"inputs": {"genres_w": [[0.5], []], "genres": [[3], []], "user": [1, 2], "item": [7, 8], '
            '"tags": [[], [1]], "age": [1, 2], "ctx": [[1, 2, 3], [4, 5, 6]]}}'
        ),
        (
            '{"inputs": {"genres_w": [[0.5], [1]], "genres": [[3], []], "user": [1, 2], "item": [7, 8], '
            '"tags": [[], [1]], "age": [1, 2], "ctx": [[1, 2, 3], [4, 5, 6]]}}'
        ),
        (
            '{"inputs": {"user": [1, 2], "item": [7], "genres": [[3], []], "tags": [[], [1]], "age": [1, 2], '
            '"ctx": [[1, 2, 3], [4, 5, 6]]}}'
        ),
        (
            '{"inputs": {"user": [1], "user": [2], "item": [7], "genres": [[3]], "tags": [[]], "age": [1], '
            '"ctx": [[1, 2, 3]]}}'
        ),
        '{"inputs": [1, 2]}',
        '{"instances": {}}',
        '{"instances": []}',
        "[]",
        "",
        "\ufeff{}",
        '{"instances": [' + _ROW + "]",
    ],
)
def test_hostile_bodies_agree_with_the_reference(body: str) -> None:
    _check(body.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(
    "body",
    [
        _plain(_ROWS, False),
        _plain(_ROWS, True),
        _plain(_ROWS, False).replace(b'"user": 1', b'"user": true'),
        _plain(_ROWS, True).replace(b'"user": [1', b'"user": [true'),
        _plain(_ROWS, False).replace(b"{", b"{" * 70, 1),
        ('{"instances": [' + _ROW + '], "signature_name": "\\ud800"}').encode(),
    ],
)
def test_rest_codec_one_pass_gives_the_reference_batch_or_error(body: bytes) -> None:
    """What the route runs: the one pass, else ``parse_document`` + ``parse_predict`` (native off: the reference)."""

    def route() -> tuple[str, FeatureBatch, jt.Format] | str:
        try:
            one = parse_predict_embedding("m", VersionSpec(), body, LIMITS, MANIFEST)
            if one is None:
                one = parse_predict("m", VersionSpec(), parse_document(body, LIMITS), body)
            req, inputs = one
            return req.signature, inputs.features(MANIFEST), inputs.format
        except GatewayError as exc:
            return f"{exc.code.name}: {exc.message}"

    with native_mode("auto"):
        got = route()
    with native_mode("off"):
        ref = route()
    if isinstance(ref, str):
        assert got == ref
    else:
        assert not isinstance(got, str) and got[0] == ref[0]
        _same(got[1:], ref[1:])


def test_a_batch_read_for_another_manifest_is_read_again() -> None:
    """Served at another version's manifest than the one the pass used: the features are read for that one."""
    other = MANIFEST.model_copy(update={"version": 2})
    body = _plain(_ROWS, False)
    with native_mode("auto"):
        one = parse_predict_embedding("m", VersionSpec(), body, LIMITS, MANIFEST)
        assert one is not None
        batch = one[1].features(other)
    ref = _reference(body, LIMITS, other)
    assert not isinstance(ref, str)
    _same((batch, one[1].format), ref[1:])


_LITERAL = st.builds(
    lambda sign, whole, frac, exp: f"{sign}{whole}{frac}{exp}",
    st.sampled_from(["", "-"]),
    st.sampled_from(["0", "1", "9", "12345", "999999999999999", "1000000000000000", "9007199254740993"])
    | st.integers(0, 10**16).map(str),
    st.sampled_from(["", ".0", ".5", ".1", ".000001", ".30000000000000004"])
    | st.integers(0, 10**17).map(lambda n: f".{n}"),
    st.sampled_from(["", "e0", "e22", "e-22", "E+23", "e-23", "e308", "e-320", "e400"])
    | st.integers(-30, 30).map(lambda n: f"e{n}"),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_LITERAL, min_size=4, max_size=4))
def test_decimal_literals_narrow_as_the_reference(literals: list[str]) -> None:
    """Dense values and weights written as decimal literals (the exact fast path and the general parser)."""
    age, *ctx = literals
    body = (
        '{"instances": [{"user": 1, "item": 7, "genres": [3], "genres_w": [' + literals[0] + '], "tags": [], '
        '"age": ' + age + ', "ctx": [' + ", ".join(ctx) + "]}]}"
    )
    _check(body.encode())


def test_common_decimal_literals_are_answered_natively() -> None:
    body = (
        '{"instances": [{"user": 1, "item": 7, "genres": [3], "genres_w": [0.1], "tags": [], "age": -0.5e-3, '
        '"ctx": [123.456, 1e22, 0.30000000000000004]}]}'
    )
    assert _check(body.encode())


@pytest.mark.parametrize(
    "body",
    [
        b'{"instances": [' + _ROW.encode() + b'], "signature_name": "a\xffb"}',
        b'{"instances": [{"us\xff": 1, ' + _FULL.encode() + b"}]}",
        b'{"instances": [' + _ROW.encode() + b'], "signature_name": "\xed\xa0\x80"}',  # an encoded surrogate
    ],
)
def test_invalid_utf8_is_left_to_the_reference(body: bytes) -> None:
    """The reference reads invalid UTF-8 with replacement characters (as rapidjson): the one pass declines."""
    with native_mode("auto"):
        assert native.rest_batch(body, MANIFEST, LIMITS) is None


def _corpus() -> list[bytes]:
    """The REST fuzz corpus: TF Serving's own JSON tensor cases and errors, the native codec's corpus."""
    from tests.gateway.codec.test_tfs_json_tensor_cases import ERRORS, REQUESTS
    from tests.gateway.test_native_codec import CORPUS

    return [r[1].encode() for r in (*REQUESTS, *ERRORS)] + [c[0].encode() for c in CORPUS]


def test_the_fuzz_corpus_is_declined_or_agrees() -> None:
    """None of these bodies fits the manifest: the one pass must decline every one (the reference words them)."""
    for body in _corpus():
        assert not _check(body), body


_NAMES: list[tuple[str, bool]] = [
    ("a" * MAX_NAME_BYTES, True),
    ("a" * (MAX_NAME_BYTES + 1), True),
    ("\u00e9" * (MAX_NAME_BYTES // 2), False),  # 4,096 bytes of UTF-8, written raw
    ("\u00e9" * (MAX_NAME_BYTES // 2 + 1), True),  # 4,098 bytes, written as \u00e9 escapes
    ("a." * 30_000, True),
]


@pytest.mark.parametrize(
    ("sig", "escaped"), _NAMES, ids=["4096", "4097", "2-byte-4096", "escaped-4098", "60k"]
)
def test_a_signature_name_longer_than_any_served_is_refused_alike_by_every_path(
    sig: str, escaped: bool
) -> None:
    """Over ``MAX_NAME_BYTES`` UTF-8 bytes (decoded), every path refuses the name with its size, and the native
    parsers refuse it without building the str; at the bound, every path returns it."""
    doc = json.loads(_plain(_ROWS, False))
    doc["signature_name"] = sig
    body = json.dumps(doc, ensure_ascii=escaped).encode()
    size = len(sig.encode())
    want = (
        f"INVALID_ARGUMENT: signature_name is {size:,} bytes long; at most 4,096 (no model, signature or version label served has "
        "a longer one)"
        if size > MAX_NAME_BYTES
        else sig
    )

    def outcome(call: Any) -> str:
        try:
            return str(call())
        except GatewayError as exc:
            return f"{exc.code.name}: {exc.message}"

    with native_mode("auto"):
        got_rest = outcome(lambda: native.rest_batch(body, MANIFEST, LIMITS)[0])  # type: ignore[index]
        got_check = outcome(lambda: native.check_predict(body, LIMITS)[0])  # type: ignore[index]
    got_reference = outcome(lambda: _signature(parse_document(body, LIMITS)))
    assert (got_rest, got_check, got_reference) == (want, want, want)
