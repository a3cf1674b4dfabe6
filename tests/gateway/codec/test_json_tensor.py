"""JSON <-> tensors by TF Serving's rules: goldens from json_tensor.cc / json_tensor_test.cc texts + properties."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec import json_tensor as jt
from gateway.codec.rapidjson import b64_decode
from gateway.errors import InvalidArgument, Unimplemented
from schemas.proto import tfs_pb2

DT = tfs_pb2.DataType


def tensors(body: str | bytes, dtypes: dict[str, int]) -> tuple[dict[str, np.ndarray], jt.Format]:
    return jt.tensors_from_request(jt.loads(body.encode() if isinstance(body, str) else body), dtypes)


# ---- parsing -----------------------------------------------------------------------------------------------------


def test_loads_keeps_int_vs_float_and_nan_tokens() -> None:
    doc = jt.loads(b'{"a": [1, 1.0, 1e2, NaN, -NaN, Inf, -Inf, Infinity, -Infinity, 18446744073709551615]}')
    a = doc["a"]
    assert type(a[0]) is int and type(a[1]) is float and type(a[2]) is float
    assert math.isnan(a[3]) and math.isnan(a[4])
    assert a[5:9] == [math.inf, -math.inf, math.inf, -math.inf]
    assert a[9] == 2**64 - 1


def test_loads_token_inside_string_untouched_and_trailing_whitespace_or_nul_ends_the_document() -> None:
    assert jt.loads(b'{"s": "Inf NaN", "x": Inf} \r\n\t') == {"s": "Inf NaN", "x": math.inf}
    assert jt.loads(b'{"x": 1} \x00 anything') == {"x": 1}  # rapidjson's stream ends at NUL


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "JSON Parse error: The document is empty"),
        (b"   ", "JSON Parse error: The document is empty. at offset: 3"),
        (b"{", "JSON Parse error: Missing a name for object member. at offset: 1"),
        (b'{"a": Nan}', "JSON Parse error: Invalid value. at offset: 6"),
        (b"[1, 2]", "JSON Value: [1, 2] Is not object"),
        (b'{"a": 1e400}', "JSON Parse error: Number too big to be stored in double. at offset: 6"),
        (b'{"a": [NaN, -1e400]}', "JSON Parse error: Number too big to be stored in double. at offset: 12"),
        (b"3", "JSON Value: 3 Is not object"),
        (
            b'{"a": 1} {"b": 2}',
            "JSON Parse error: The document root must not be followed by other values. at offset: 9",
        ),
        (
            b'{"s": "\xc3\xa9"}x',
            "JSON Parse error: The document root must not be followed by other values. at offset: 11",
        ),
    ],
)
def test_parse_errors(body: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        jt.loads(body)
    assert e.value.message == message


def test_signature_name() -> None:
    assert jt.signature_name({}) == ""
    assert jt.signature_name({"signature_name": "s"}) == "s"
    with pytest.raises(InvalidArgument, match="'signature_name' key must be a string value."):
        jt.signature_name({"signature_name": 1})


# ---- row / columnar ------------------------------------------------------------------------------------------------


def test_row_single_input() -> None:
    out, fmt = tensors('{"instances": [[1, 2], [3, 4.5]]}', {"x": DT.DT_FLOAT})
    assert fmt is jt.Format.ROW
    assert out["x"].dtype == np.float32 and out["x"].tolist() == [[1, 2], [3, 4.5]]


def test_row_named_inputs_and_columnar() -> None:
    dt = {"a": DT.DT_INT64, "s": DT.DT_STRING}
    out, _ = tensors('{"instances": [{"a": 1, "s": "x"}, {"a": 2, "s": {"b64": "aGk="}}]}', dt)
    assert out["a"].tolist() == [1, 2] and out["s"].tolist() == [b"x", b"hi"]
    out, fmt = tensors('{"inputs": {"a": [[1], [2]], "s": "q", "ignored": 0}}', dt)
    assert fmt is jt.Format.COLUMNAR
    assert out["a"].shape == (2, 1) and out["s"].shape == () and out["s"].item() == b"q"


def test_columnar_scalar_and_empty() -> None:
    assert tensors('{"inputs": 3}', {"x": DT.DT_INT32})[0]["x"].shape == ()
    assert tensors('{"inputs": []}', {"x": DT.DT_FLOAT})[0]["x"].shape == (0,)


def test_float_precision_and_overflow() -> None:
    out = tensors('{"inputs": [1435774380, 1e300, 1e-50]}', {"x": DT.DT_FLOAT})[0]["x"]
    assert out.tolist() == [1435774336.0, math.inf, 0.0]
    d = tensors('{"inputs": [0.1]}', {"x": DT.DT_DOUBLE})[0]["x"]
    assert d.dtype == np.float64 and d[0] == 0.1


def test_int_dtypes() -> None:
    assert tensors('{"inputs": [300]}', {"x": DT.DT_INT8})[0]["x"].tolist() == [300]  # TF checks IsInt() only
    for body, dt in (
        ('{"inputs": [2147483648]}', DT.DT_INT32),
        ('{"inputs": [-1]}', DT.DT_UINT32),
        ('{"inputs": [1.0]}', DT.DT_INT64),
        ('{"inputs": [true]}', DT.DT_INT64),
        ('{"inputs": [1]}', DT.DT_BOOL),
        ('{"inputs": [18446744073709551616]}', DT.DT_UINT64),
    ):
        with pytest.raises(InvalidArgument, match="is not of expected type"):
            tensors(body, {"x": dt})
    assert tensors('{"inputs": [18446744073709551615]}', {"x": DT.DT_UINT64})[0]["x"][0] == 2**64 - 1
    assert tensors('{"inputs": [true, false]}', {"x": DT.DT_BOOL})[0]["x"].tolist() == [True, False]


GOLDEN_ERRORS: list[tuple[str, dict[str, int], str]] = [
    (
        '{"instances": [1], "inputs": [1]}',
        {"x": DT.DT_FLOAT},
        "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist ",
    ),
    ('{"x": 1}', {"x": DT.DT_FLOAT}, "Missing 'inputs' or 'instances' key"),
    ('{"instances": {}}', {"x": DT.DT_FLOAT}, "Expecting 'instances' to be an list/array"),
    ('{"instances": []}', {"x": DT.DT_FLOAT}, "No values in 'instances' array"),
    (
        '{"instances": [[1,2],[3,4],[5,6,7]]}',
        {"x": DT.DT_FLOAT},
        "Failed to process element: 2 of 'instances' list. Error: INVALID_ARGUMENT: Expecting tensor size: 2 but got: 3",
    ),
    (
        '{"instances": [[1,2],[3,4],[[5,6]]]}',
        {"x": DT.DT_FLOAT},
        "Failed to process element: 2 of 'instances' list. Error: INVALID_ARGUMENT: Expecting shape [2] but got: [1,2]",
    ),
    (
        '{"instances": [1,[1]]}',
        {"x": DT.DT_FLOAT},
        "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: Expecting shape [] but got: [1]",
    ),
    (
        '{"instances": [1, 2]}',
        {"a": DT.DT_FLOAT, "b": DT.DT_FLOAT},
        (
            "instances is a plain list, but expecting list of objects as multiple input tensors required as per "
            "tensorinfo_map"
        ),
    ),
    (
        '{"instances": [{"a": 1, "b": 2}, [1]]}',
        {"a": DT.DT_FLOAT, "b": DT.DT_FLOAT},
        "Expecting object but got list at item 1 of input list",
    ),
    (
        '{"instances": [1, {"a": 1}]}',
        {"a": DT.DT_FLOAT},
        "Expecting value/list but got object at item 1 of input list",
    ),
    (
        '{"instances": [{"a": 1, "c": 2}]}',
        {"a": DT.DT_FLOAT, "b": DT.DT_FLOAT},
        (
            "Failed to process element: 0 key: c of 'instances' list. Error: INVALID_ARGUMENT: "
            "JSON object: does not have named input: c"
        ),
    ),
    (
        '{"instances": [{"a": 1}]}',
        {"a": DT.DT_FLOAT, "b": DT.DT_FLOAT},
        "Failed to process element: 0 of 'instances' list. JSON object: {\n    \"a\": 1\n} keys must be equal to: a,b",
    ),
    (
        '{"inputs": [1, 2]}',
        {"a": DT.DT_FLOAT, "b": DT.DT_FLOAT},
        "inputs is a plain value/list, but expecting an object as multiple input tensors required as per tensorinfo_map",
    ),
    (
        '{"inputs": {"a": 1}}',
        {"a": DT.DT_FLOAT, "b": DT.DT_FLOAT},
        "Missing named input: b in 'inputs' object.",
    ),
    (
        '{"inputs": [[1, 2], [3]]}',
        {"x": DT.DT_FLOAT},
        "Encountered list at unexpected size: 1 at level: 1 expected size: 2",
    ),
    (
        '{"inputs": [[1, 2], [3, [4]]]}',
        {"x": DT.DT_FLOAT},
        "Encountered list at unexpected level: 2 expected < 2",
    ),
    (
        '{"inputs": [[1, 2], 3]}',
        {"x": DT.DT_FLOAT},
        "JSON Value: 3 found at incorrect level: 2 in the JSON DOM. Expected at level: 2",
    ),
    ('{"inputs": ["a"]}', {"x": DT.DT_FLOAT}, 'JSON Value: "a" Type: String is not of expected type: float'),
    ('{"inputs": [null]}', {"x": DT.DT_INT32}, "JSON Value: null Type: Null is not of expected type: int32"),
    (
        '{"inputs": [{"b64": "aGk="}]}',
        {"x": DT.DT_FLOAT},
        'JSON Value: {\n    "b64": "aGk="\n} Type: Object is not of expected type: float',
    ),
    (
        '{"inputs": [{"b64": 1}]}',
        {"x": DT.DT_STRING},
        'JSON Value: {\n    "b64": 1\n} not formatted correctly for base64 data',
    ),
    ('{"inputs": [{"b64": "aGk_"}]}', {"x": DT.DT_STRING}, "Unable to base64 decode"),
]


@pytest.mark.parametrize(("body", "dtypes", "message"), GOLDEN_ERRORS)
def test_golden_errors(body: str, dtypes: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        tensors(body, dtypes)
    assert e.value.message.endswith(message), e.value.message


def test_unimplemented_dtype_columnar_vs_row() -> None:
    with pytest.raises(Unimplemented, match="Conversion of JSON Value: 1 to type: half"):
        tensors('{"inputs": [1]}', {"x": DT.DT_HALF})
    with pytest.raises(
        InvalidArgument, match="Error: UNIMPLEMENTED: Conversion of JSON Value: 1 to type: half"
    ):
        tensors('{"instances": [1]}', {"x": DT.DT_HALF})


@pytest.mark.parametrize(
    ("text", "raw"),
    [("aGk=", b"hi"), ("aGk", b"hi"), ("aG k=", b"hi"), ("aGk.", b"hi"), ("", b""), ("YWJj", b"abc")],
)
def test_b64_absl_rules(text: str, raw: bytes) -> None:
    assert b64_decode(text) == raw


@pytest.mark.parametrize("text", ["aGk==", "a", "aG-_", "a=Gk", "aGk=x"])
def test_b64_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument, match="Unable to base64 decode"):
        b64_decode(text)


# ---- responses ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (9e6, "9e+06"),
        (999999.0, "999999.0"),
        (0.5, "0.5"),
        (0.0003, "0.0003"),
        (3e-05, "3e-05"),
        (555557.5, "555557.5"),
        (float(np.float32(0.2)), "0.2"),
        (42.0, "42.0"),
        (math.nan, "NaN"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
    ],
)
def test_format_float_goldens(value: float, text: str) -> None:
    assert jt.format_float(value) == text


def test_predict_response_row_and_columnar() -> None:
    out = {"y": np.array([[0.2], [1.0]], dtype=np.float32)}
    assert json.loads(jt.predict_response(out, jt.Format.ROW)) == {"predictions": [[0.2], [1.0]]}
    two = {"a": np.array([1, 2], dtype=np.int64), "b_bytes": np.array([b"\x00", b"z"], dtype=object)}
    assert json.loads(jt.predict_response(two, jt.Format.ROW)) == {
        "predictions": [{"a": 1, "b_bytes": {"b64": "AA=="}}, {"a": 2, "b_bytes": {"b64": "eg=="}}]
    }
    assert json.loads(jt.predict_response(two, jt.Format.COLUMNAR)) == {
        "outputs": {"a": [1, 2], "b_bytes": [{"b64": "AA=="}, {"b64": "eg=="}]}
    }
    assert json.loads(jt.predict_response({"s": np.array(True)}, jt.Format.COLUMNAR)) == {"outputs": True}
    assert json.loads(jt.predict_response({"e": np.zeros((0, 2), np.float32)}, jt.Format.ROW)) == {
        "predictions": []
    }


def test_predict_response_row_errors() -> None:
    with pytest.raises(InvalidArgument, match="Tensor name: s has no shape information"):
        jt.predict_response({"s": np.float32(1.0) * np.ones(())}, jt.Format.ROW)
    with pytest.raises(InvalidArgument, match="Tensor name: b has inconsistent batch size: 3 expecting: 2"):
        jt.predict_response({"a": np.zeros(2), "b": np.zeros(3)}, jt.Format.ROW)


def test_classify_regress_error_bodies() -> None:
    assert json.loads(jt.regress_response([0.5, 2.0])) == {"results": [0.5, 2.0]}
    assert json.loads(jt.classify_response([[("", 12.0)]])) == {"results": [[["", 12.0]]]}
    assert jt.error_body('say "hi"') == b'{\n    "error": "say \\"hi\\""\n}'


# ---- properties ---------------------------------------------------------------------------------------------------

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32))
def test_float32_output_round_trips(v: float) -> None:
    text = jt.format_float(v)
    back = json.loads(text) if text not in ("NaN", "Infinity", "-Infinity") else float(text)
    assert (math.isnan(v) and math.isnan(back)) or np.float32(back) == np.float32(v)
    assert "." in text or "e" in text or text in ("NaN", "Infinity", "-Infinity")


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.data())
def test_row_columnar_agree_and_round_trip(batch: int, width: int, data: Any) -> None:
    rows = [data.draw(st.lists(finite_f32, min_size=width, max_size=width)) for _ in range(batch)]
    row, _ = tensors(json.dumps({"instances": rows}), {"x": DT.DT_FLOAT})
    col, _ = tensors(json.dumps({"inputs": rows}), {"x": DT.DT_FLOAT})
    np.testing.assert_array_equal(row["x"], col["x"])
    assert row["x"].shape == (batch, width)
    body = jt.predict_response({"y": row["x"]}, jt.Format.ROW)
    back = np.asarray(json.loads(body)["predictions"], dtype=np.float32).reshape(batch, width)
    np.testing.assert_array_equal(back, row["x"])


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.integers(-5, 5), lambda c: st.lists(c, max_size=3), max_leaves=12))
def test_ragged_values_error_or_are_dense(value: Any) -> None:
    try:
        out, _ = tensors(json.dumps({"inputs": value}), {"x": DT.DT_INT64})
    except InvalidArgument:
        return
    assert np.asarray(out["x"]).tolist() == value


# ---- the numpy fast path agrees with the exact path ------------------------------------------------------------

_leaf = st.one_of(st.integers(-(2**65), 2**65), st.floats(width=64), st.sampled_from(["s", None]))
_nested = st.recursive(_leaf, lambda c: st.lists(c, max_size=3), max_leaves=10)


def _outcome(doc: dict[str, Any], dtypes: dict[str, int], fast: bool) -> Any:
    try:
        out, fmt = jt.tensors_from_request(doc, dtypes, fast=fast)
    except (InvalidArgument, Unimplemented) as exc:
        return ("error", type(exc).__name__, exc.message)
    return ("ok", fmt, {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in out.items()})


@settings(max_examples=300, deadline=None)
@given(
    _nested,
    st.sampled_from([DT.DT_FLOAT, DT.DT_DOUBLE, DT.DT_INT32, DT.DT_INT64, DT.DT_UINT64, DT.DT_INT8]),
    st.sampled_from(["inputs", "instances", "named"]),
)
def test_fast_path_equals_exact_path(value: Any, dtype: int, form: str) -> None:
    if form == "inputs":
        doc: dict[str, Any] = {"inputs": value}
    elif form == "instances":
        doc = {"instances": value if isinstance(value, list) and value else [value]}
    else:
        items = value if isinstance(value, list) and value else [value]
        doc = {"instances": [{"x": v} for v in items]}
    assert _outcome(doc, {"x": dtype}, True) == _outcome(doc, {"x": dtype}, False)


def test_may_contain_bools() -> None:
    assert jt.may_contain_bools(b'{"instances": [true]}')
    assert not jt.may_contain_bools(b'{"instances": [1.0]}')


def test_large_outputs_use_the_fast_writer_with_equal_values() -> None:
    big = (np.arange(10_000, dtype=np.float32) / 7).reshape(5000, 2)
    fast = json.loads(jt.predict_response({"y": big}, jt.Format.ROW))["predictions"]
    np.testing.assert_array_equal(np.asarray(fast, dtype=np.float32), big)
    two = json.loads(jt.predict_response({"y": big, "z": big[:, 0].astype(np.int64)}, jt.Format.ROW))
    item = two["predictions"][3]
    assert item["z"] == int(big[3, 0])
    np.testing.assert_array_equal(np.asarray(item["y"], dtype=np.float32), big[3])
    big[0, 0] = np.nan  # non-finite values keep TF Serving's tokens
    assert b"NaN" in jt.predict_response({"y": big}, jt.Format.COLUMNAR)
