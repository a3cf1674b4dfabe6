"""gateway.codec.example: absl base64 rules, TF Serving's classify/regress JSON -> Input, tf.Example bytes."""

from __future__ import annotations

import base64
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.codec.example import input_from_json, parse_example
from gateway.codec.rapidjson import b64_decode
from gateway.errors import InvalidArgument
from schemas.proto import tfs_pb2

tf = pytest.importorskip("tensorflow")

# -- base64 -----------------------------------------------------------------------------------------------------------

# absl::Base64Unescape golden cases (absl/strings/escaping.cc Base64UnescapeInternal, read by hand).
B64_OK = [
    ("", b""),
    ("QQ==", b"A"),
    ("QQ", b"A"),  # padding optional
    ("QUI=", b"AB"),
    ("QUI", b"AB"),
    ("QUJD", b"ABC"),
    ("QUJDRA==", b"ABCD"),
    ("QUJDRA", b"ABCD"),
    ("QU JD\n", b"ABC"),  # whitespace skipped anywhere
    ("\t\n\v\f\rQUJD", b"ABC"),
    (" Q Q = = ", b"A"),
    ("QQ\n==\n", b"A"),
    ("QQ..", b"A"),  # '.' is a pad character too
    ("QQ=.", b"A"),
    ("QUI.", b"AB"),
    ("QR==", b"A"),  # non-zero unused bits are ignored
    ("QR", b"A"),
    ("   ", b""),
    ("+/+/", b"\xfb\xff\xbf"),
]
B64_BAD = [
    "QUJD=",  # a pad after a full quad
    "QQ=",  # one pad where two are needed
    "QQ===",
    "QUI==",
    "Q",  # one leftover char
    "QUJDQ",
    "QUJDQ==",
    "QQ==QQ==",  # data after padding
    "QQ= x",
    "QU-_",  # URL-safe alphabet
    "QUJD!",
    "QQ==\x00",
    "QUJ\x00",
    "é",
    "=",
    "====",
    "QUJD\u00a0",  # non-ASCII space is not whitespace for absl
]


@pytest.mark.parametrize(("text", "expected"), B64_OK)
def test_b64_decode_accepts(text: str, expected: bytes) -> None:
    assert b64_decode(text) == expected


@pytest.mark.parametrize("text", B64_BAD)
def test_b64_decode_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^Unable to base64 decode$"):
        b64_decode(text)


@given(
    data=st.binary(max_size=64),
    strip_padding=st.booleans(),
    spaces=st.lists(st.tuples(st.integers(0, 200), st.sampled_from(" \t\n\r\v\f")), max_size=5),
)
def test_b64_decode_round_trips_with_whitespace_and_optional_padding(
    data: bytes, strip_padding: bool, spaces: list[tuple[int, str]]
) -> None:
    text = base64.b64encode(data).decode()
    if strip_padding:
        text = text.rstrip("=")
    for pos, ch in spaces:
        pos = pos % (len(text) + 1)
        text = text[:pos] + ch + text[pos:]
    assert b64_decode(text) == data


@given(text=st.text(alphabet="ABCabc019+/=.-_ \n!", max_size=16))
def test_b64_decode_matches_a_direct_reading_of_absl(text: str) -> None:
    expected = _absl_reference(text)
    if expected is None:
        with pytest.raises(InvalidArgument):
            b64_decode(text)
    else:
        assert b64_decode(text) == expected


def _absl_reference(text: str) -> bytes | None:
    """A char-by-char transcription of absl's decoder (slow, obviously shaped like the C++ state machine)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = bytearray()
    state = temp = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in " \t\n\v\f\r":
            i += 1
            continue
        if ch in "=.":
            break
        if ch not in alphabet:
            return None
        temp = (temp << 6) | alphabet.index(ch)
        state += 1
        if state == 4:
            out += temp.to_bytes(3, "big")
            state = temp = 0
        i += 1
    if state == 1:
        return None
    if state == 2:
        out.append((temp >> 4) & 0xFF)
    if state == 3:
        out += ((temp >> 2) & 0xFFFF).to_bytes(2, "big")
    expected = {0: 0, 2: 2, 3: 1}[state]
    equals = 0
    for ch in text[i:]:
        if ch in "=.":
            equals += 1
        elif ch not in " \t\n\v\f\r":
            return None
    return bytes(out) if equals in (0, expected) else None


def test_b64_decode_rejects_non_strings() -> None:
    with pytest.raises(InvalidArgument, match="Unable to base64 decode"):
        b64_decode(b"QQ==")  # type: ignore[arg-type]


# -- tf.Example bytes -------------------------------------------------------------------------------------------------

_feature_values = st.one_of(
    st.tuples(st.just("int64"), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)),
    st.tuples(st.just("float"), st.lists(st.floats(width=32, allow_nan=False), max_size=5)),
    st.tuples(st.just("bytes"), st.lists(st.binary(max_size=8), max_size=3)),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    features=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), _feature_values, max_size=5
    )
)
def test_example_bytes_from_tensorflow_parse_identically(features: dict[str, tuple[str, list[Any]]]) -> None:
    tf_features = {}
    for name, (kind, values) in features.items():
        if kind == "int64":
            tf_features[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        elif kind == "float":
            tf_features[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        else:
            tf_features[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    data = tf.train.Example(features=tf.train.Features(feature=tf_features)).SerializeToString()

    ours = parse_example(data, 0)

    assert set(ours.features.feature) == set(features)
    for name, (kind, values) in features.items():
        feature = ours.features.feature[name]
        assert feature.WhichOneof("kind") == f"{kind}_list"
        assert list(getattr(feature, f"{kind}_list").value) == values
    # and back: our bytes are a tf.train.Example TensorFlow reads the same
    assert tf.train.Example.FromString(ours.SerializeToString()) == tf.train.Example.FromString(data)


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\xff", b"\x0a\x02\x0a\x05"])
def test_parse_example_names_the_example_index(data: bytes) -> None:
    with pytest.raises(
        InvalidArgument, match=r"^example 3: the bytes do not parse as a serialized tf\.Example$"
    ):
        parse_example(data, 3)


def test_parse_example_empty_bytes_is_an_empty_example() -> None:
    assert parse_example(b"", 0) == tfs_pb2.Example()


# -- classify / regress JSON ------------------------------------------------------------------------------------------


def _features(example: tfs_pb2.Example) -> dict[str, tuple[str | None, list[Any]]]:
    out: dict[str, tuple[str | None, list[Any]]] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = (kind, list(getattr(feature, kind).value) if kind else [])
    return out


@pytest.mark.parametrize("method", ["classify", "regress"])
def test_input_from_json_kinds_follow_json_tokens(method: str) -> None:
    body = {
        "signature_name": "ignored here",
        "examples": [
            {
                "i": 1,
                "il": [1, -2, 2**63 - 1],
                "f": 1.5,
                "fl": [0.5, 2.0, float("nan"), float("inf")],
                "s": "héllo",
                "b": {"b64": "QUJD"},
                "bl": [{"b64": "QQ=="}, "x"],
                "t": [True, False],
                "e": [],
                "big": 2**64,  # beyond uint64: rapidjson reads a double
            },
            {},
        ],
    }
    inp = input_from_json(body, method)
    assert inp.WhichOneof("kind") == "example_list"
    assert len(inp.example_list.examples) == 2
    got = _features(inp.example_list.examples[0])
    assert got["i"] == ("int64_list", [1])
    assert got["il"] == ("int64_list", [1, -2, 2**63 - 1])
    assert got["f"] == ("float_list", [1.5])
    kind, values = got["fl"]
    assert (
        kind == "float_list" and values[:2] == [0.5, 2.0] and math.isnan(values[2]) and values[3] == math.inf
    )
    assert got["s"] == ("bytes_list", ["héllo".encode()])
    assert got["b"] == ("bytes_list", [b"ABC"])
    assert got["bl"] == ("bytes_list", [b"A", b"x"])
    assert got["t"] == ("int64_list", [1, 0])
    assert got["e"] == (None, [])
    assert got["big"] == ("float_list", [pytest.approx(2.0**64, rel=1e-7)])
    assert _features(inp.example_list.examples[1]) == {}


def test_input_from_json_with_context() -> None:
    inp = input_from_json({"context": {"c": [1, 2]}, "examples": [{"a": 1}, {"a": 2}]}, "regress")
    assert inp.WhichOneof("kind") == "example_list_with_context"
    ctx = inp.example_list_with_context
    assert _features(ctx.context) == {"c": ("int64_list", [1, 2])}
    assert [_features(e) for e in ctx.examples] == [{"a": ("int64_list", [1])}, {"a": ("int64_list", [2])}]


def test_input_from_json_is_wire_compatible_with_tensorflow_serving_input() -> None:
    input_pb2 = pytest.importorskip("tensorflow_serving.apis.input_pb2")
    inp = input_from_json({"context": {"c": 1.5}, "examples": [{"a": [1, 2], "s": "x"}]}, "classify")
    theirs = input_pb2.Input.FromString(inp.SerializeToString())
    assert theirs.example_list_with_context.examples[0].features.feature["a"].int64_list.value == [1, 2]
    assert theirs.example_list_with_context.context.features.feature["c"].float_list.value == [1.5]


# TF Serving's exact texts (json_tensor.cc; ../shared/notes/tfserving-api.md §2.9 and §2.10 rendering).
JSON_ERRORS: list[tuple[Any, str]] = [
    ({}, "JSON Value: {} When method is classify, key 'examples' is expected and was not found"),
    (
        {"context": {"a": 1}},
        (
            'JSON Value: {\n    "context": {\n        "a": 1\n    }\n} When method is classify, key \'examples\' is '
            "expected and was not found"
        ),
    ),
    ({"examples": 1}, "JSON Value: {\n    \"examples\": 1\n} Expecting 'examples' value to be an list/array"),
    (
        {"examples": {"a": 1}},
        'JSON Value: {\n    "examples": {\n        "a": 1\n    }\n} Expecting \'examples\' value to be an list/array',
    ),
    ({"examples": []}, "JSON Value: {\n    \"examples\": []\n} 'examples' value is an empty array"),
    ({"examples": [1]}, "Example must be JSON object but got JSON Number"),
    ({"examples": [[]]}, "Example must be JSON object but got JSON Array"),
    ({"examples": ["x"]}, "Example must be JSON object but got JSON String"),
    ({"examples": [None]}, "Example must be JSON object but got JSON Null"),
    ({"examples": [True]}, "Example must be JSON object but got JSON True"),
    ({"context": 1, "examples": [{}]}, "Example must be JSON object but got JSON Number"),
    ({"context": [], "examples": 5}, "Example must be JSON object but got JSON Array"),  # context first
    ({"examples": [{"a": None}]}, "Feature: a has element with unexpected JSON type: Null"),
    ({"examples": [{"a": [1, None]}]}, "Feature: a has element with unexpected JSON type: Null"),
    ({"examples": [{"a": [[1]]}]}, "Feature: a has element with unexpected JSON type: Array"),
    ({"examples": [{"a": {"x": 1}}]}, "Feature: a has element with unexpected JSON type: Object"),
    (
        {"examples": [{"a": {"b64": "QQ==", "x": 1}}]},
        "Feature: a has element with unexpected JSON type: Object",
    ),
    ({"examples": [{"a": {"b64": 1}}]}, "Feature: a has element with unexpected JSON type: Object"),
    ({"examples": [{"a": [1, 1.5]}]}, "Unexpected element type in feature: a expecting type: int64"),
    ({"examples": [{"a": [1.5, 1]}]}, "Unexpected element type in feature: a expecting type: float"),
    ({"examples": [{"a": ["x", 1]}]}, "Unexpected element type in feature: a expecting type: bytes"),
    ({"examples": [{"a": [1, "x"]}]}, "Unexpected element type in feature: a expecting type: int64"),
    ({"examples": [{"a": [1.5, True]}]}, "Unexpected element type in feature: a expecting type: float"),
    ({"examples": [{"a": [1, {"b64": "!"}]}]}, "Unexpected element type in feature: a expecting type: int64"),
    ({"examples": [{"a": [1.5, 2**63]}]}, "Unexpected element type in feature: a expecting type: float"),
    ({"examples": [{"a": 2**63}]}, "Feature: a has uint64_t element. Only int64_t is supported."),
    ({"examples": [{"a": [1, 2**64 - 1]}]}, "Feature: a has uint64_t element. Only int64_t is supported."),
    ({"examples": [{"a": {"b64": "QQ="}}]}, "Unable to base64 decode"),
    ({"examples": [{"a": 1e39}]}, "Cannot convert JSON value: 1e39 to float without loss of precision."),
    ({"examples": [{"a": -1e39}]}, "Cannot convert JSON value: -1e39 to float without loss of precision."),
    (
        {"examples": [{"a": 10**40}]},
        f"Cannot convert JSON value: {10**40} to float without loss of precision.",
    ),
    ([1], "JSON Value: [1] Is not object"),
]


@pytest.mark.parametrize(("body", "message"), JSON_ERRORS)
@pytest.mark.parametrize("method", ["classify", "regress"])
def test_input_from_json_errors_use_tf_serving_texts(body: Any, message: str, method: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        input_from_json(body, method)
    assert info.value.message == message
    assert info.value.http_status == 400


def test_input_from_json_truncates_long_documents_in_errors() -> None:
    body = {"padding": "x" * 1000}
    with pytest.raises(InvalidArgument) as info:
        input_from_json(body, "classify")
    head, _, tail = info.value.message.partition("... ")
    assert (
        head.startswith('JSON Value: {\n    "padding": "xxx')
        and len(head.encode()) == len("JSON Value: ") + 256
    )
    assert tail == "When method is classify, key 'examples' is expected and was not found"


def test_input_from_json_rejects_unknown_methods() -> None:
    with pytest.raises(ValueError, match="method"):
        input_from_json({"examples": [{}]}, "predict")
