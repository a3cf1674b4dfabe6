"""Every case of TF Serving's ``tensorflow_serving/util/json_tensor_test.cc``, as data, against our pure codecs.

Each TF test becomes one or more rows (TF's test name in the row id). Request cases give the body, the signature's
input dtypes and the tensors (dtype, shape, values) or the error text expected; response cases give the tensors and
the exact bytes TF Serving's rapidjson PrettyWriter produces (TF's own tests only compare parsed JSON, so every
expected body below is also checked to parse to the document TF's test expects).

Cases that cannot apply as written, and why:

* ``TensorFromNonNullTerminatedBuffer``: a C++ buffer-length detail (the buffer ends before the trailing ``X``):
  the ``trailing_bytes_excluded`` row; the same ``X`` inside the body is an error for rapidjson's ``ParseStream``
  (``kParseErrorDocumentRootNotSingular``), the ``trailing_bytes`` error row.
* ``SingleUnnamedTensorErrors`` "loss of precision" rows (DBL_MAX or 16777217 for DT_FLOAT, 2^53+1 for DT_DOUBLE):
  that check (``IsLosslessDecimal``) was removed from later TF Serving; its REST guide ("Floating Point Precision")
  documents silent rounding instead, which is what the gateway does (rows ``*_rounds``). The classify/regress
  feature check of DBL_MAX is still there and still an error (``examples_double_max``).
* ``JsonErrors`` uint64 row: TF's test was written against "has uint64 element. Only int64 is supported."; current
  sources say ``uint64_t``/``int64_t``, which is what we assert.
* ``MakeJsonFromTensors.StatusOK`` (an OK status renders as an empty string): the gateway never renders a body for
  an OK status, so there is nothing to compare.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from gateway.codec import json_tensor as jt
from gateway.codec.example import input_from_json
from gateway.errors import InvalidArgument
from schemas.proto import tfs_pb2

DT = tfs_pb2.DataType
I32, I64, F32, F64, STR = DT.DT_INT32, DT.DT_INT64, DT.DT_FLOAT, DT.DT_DOUBLE, DT.DT_STRING
ROW, COL = jt.Format.ROW, jt.Format.COLUMNAR


def _decode(body: str, dtypes: dict[str, int]) -> tuple[dict[str, np.ndarray], jt.Format]:
    doc = jt.loads(body.encode())
    return jt.tensors_from_request(doc, dtypes)


# ---- request side: (id, body, signature dtypes, format, {input: (numpy dtype, shape, flat values)}) ---------------

T = tuple[str, tuple[int, ...], list[Any]]
REQUESTS: list[tuple[str, str, dict[str, int], jt.Format, dict[str, T]]] = [
    (
        "SingleUnnamedTensor",
        '{"instances": [[1,2],[3,4],[5,6]]}',
        {"default": I32},
        ROW,
        {"default": ("int32", (3, 2), [1, 2, 3, 4, 5, 6])},
    ),
    (
        "MixedInputForFloatTensor",
        '{"instances": [1, 2.0, 3, 4, 5.003, 0.007, 0.0]}',
        {"default": F32},
        ROW,
        {"default": ("float32", (7,), [1, 2, 3, 4, np.float32(5.003), np.float32(0.007), 0])},
    ),
    (
        "MixedInputForDoubleTensor",
        '{"instances": [1.0, 2, 3, 4, 0.662, 0, 0.0]}',
        {"default": F64},
        ROW,
        {"default": ("float64", (7,), [1, 2, 3, 4, 0.662, 0, 0])},
    ),
    (
        "SingleUnnamedTensorWithSignature",
        '{"signature_name": "predict_images", "instances": [[1,2]]}',
        {"default": I32},
        ROW,
        {"default": ("int32", (1, 2), [1, 2])},
    ),
    (
        "trailing_bytes_excluded",  # TensorFromNonNullTerminatedBuffer: the body ends before the 'X'
        '{"instances": [[1,2],[3,4],[5,6]]}',
        {"default": I32},
        ROW,
        {"default": ("int32", (3, 2), [1, 2, 3, 4, 5, 6])},
    ),
    (
        "SingleUnnamedTensorBase64Scalars",
        '{"instances": [ { "b64" : "aGVsbG8=" }, { "b64": "d29ybGQ=" } ]}',
        {"default": STR},
        ROW,
        {"default": ("object", (2,), [b"hello", b"world"])},
    ),
    (
        "SingleUnnamedTensorBase64Lists",
        '{"instances": [ [{ "b64" : "aGVsbG8=" }], [{ "b64": "d29ybGQ=" }] ]}',
        {"default": STR},
        ROW,
        {"default": ("object", (2, 1), [b"hello", b"world"])},
    ),
    (
        "SingleNamedTensorBase64",
        '{"instances": [{"default": [ [{ "b64" : "aGVsbG8=" }], [{ "b64": "d29ybGQ=" }] ]}]}',
        {"default": STR},
        ROW,
        {"default": ("object", (1, 2, 1), [b"hello", b"world"])},
    ),
    (
        "MultipleNamedTensor",
        """{"instances": [
            {"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"],
             "float_tensor": [1.0, NaN], "dbl_tensor": [NaN]},
            {"int_tensor": [[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"],
             "float_tensor": [2.0, Infinity], "dbl_tensor": [2.0]}
        ]}""",
        {"int_tensor": I32, "str_tensor": STR, "float_tensor": F32, "dbl_tensor": F64},
        ROW,
        {
            "int_tensor": ("int32", (2, 3, 2), [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]),
            "str_tensor": ("object", (2, 2), [b"foo", b"bar", b"baz", b"bat"]),
            "float_tensor": ("float32", (2, 2), [1.0, math.nan, 2.0, math.inf]),
            "dbl_tensor": ("float64", (2, 1), [math.nan, 2.0]),
        },
    ),
    (
        "SingleUnnamedTensorColumnarFormat/named",
        '{"inputs": {"int_tensor": [[[1,2],[3,4],[5,6]]]}}',
        {"int_tensor": I32},
        COL,
        {"int_tensor": ("int32", (1, 3, 2), [1, 2, 3, 4, 5, 6])},
    ),
    (
        "SingleUnnamedTensorColumnarFormat/unnamed",
        '{"inputs": [[[1,2],[3,4],[5,6]]]}',
        {"int_tensor": I32},
        COL,
        {"int_tensor": ("int32", (1, 3, 2), [1, 2, 3, 4, 5, 6])},
    ),
    (
        "MultipleNamedTensorColumnarFormat",
        """{"inputs": {"int_tensor": [[[1,2],[3,4],[5,6]]], "str_tensor": ["foo", "bar"],
                      "bin_tensor": { "b64" : "aGVsbG8=" }}}""",
        {"int_tensor": I32, "str_tensor": STR, "bin_tensor": STR},
        COL,
        {
            "int_tensor": ("int32", (1, 3, 2), [1, 2, 3, 4, 5, 6]),
            "str_tensor": ("object", (2,), [b"foo", b"bar"]),
            "bin_tensor": ("object", (), [b"hello"]),
        },
    ),
    # Current TF Serving rounds instead of refusing (see the module docstring).
    ("SingleUnnamedTensorErrors/dbl_max_float_rounds", '{"instances": [1.7976931348623157e308]}',
     {"default": F32}, ROW, {"default": ("float32", (1,), [math.inf])}),
    ("SingleUnnamedTensorErrors/16777217_float_rounds", '{"instances": [16777217]}',
     {"default": F32}, ROW, {"default": ("float32", (1,), [16777216.0])}),
    ("SingleUnnamedTensorErrors/2^53+1_double_rounds", '{"instances": [9007199254740993]}',
     {"default": F64}, ROW, {"default": ("float64", (1,), [9007199254740992.0])}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "dtypes", "fmt", "expected"), [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS]
)
def test_request(body: str, dtypes: dict[str, int], fmt: jt.Format, expected: dict[str, T]) -> None:
    tensors, got_fmt = _decode(body, dtypes)
    assert got_fmt is fmt
    assert set(tensors) == set(expected)
    for name, (dtype, shape, values) in expected.items():
        arr = tensors[name]
        assert arr.dtype == np.dtype(dtype), name
        assert arr.shape == shape, name
        if dtype == "object":
            assert arr.reshape(-1).tolist() == values
        else:
            np.testing.assert_array_equal(arr.reshape(-1), np.array(values, dtype=dtype))


def test_signature_name_is_read() -> None:  # SingleUnnamedTensorWithSignature
    assert jt.signature_name(jt.loads(b'{"signature_name": "predict_images", "instances": [[1,2]]}')) == (
        "predict_images"
    )


# ---- request errors: (id, body, dtypes, text the message must contain) ---------------------------------------------

ERRORS: list[tuple[str, str, dict[str, int], str]] = [
    ("SingleUnnamedTensorErrors/empty", "", {"default": I32}, "document is empty"),
    ("SingleUnnamedTensorErrors/signature_not_string",
     '{"signature_name": 5, "instances": [[1,2],[3,4],[5,6,7]]}', {"default": I32}, "must be a string value"),
    ("SingleUnnamedTensorErrors/both_keys",
     '{"instances": [[1,2],[3,4],[5,6,7]], "inputs": [[1,2],[3,4],[5,6,7]]}', {"default": I32},
     "Not formatted correctly"),
    ("SingleUnnamedTensorErrors/size", '{"instances": [[1,2],[3,4],[5,6,7]]}', {"default": I32},
     "Expecting tensor size"),
    ("SingleUnnamedTensorErrors/shape", '{"instances": [[1,2],[3,4],[[5,6]]]}', {"default": I32},
     "Expecting shape"),
    ("SingleUnnamedTensorErrors/rank", '{"instances": [1, [1]]}', {"default": I32}, "Expecting shape"),
    ("SingleUnnamedTensorErrors/type", '{"instances": [[1,2],["a", "b"]]}', {"default": I32},
     "not of expected type"),
    ("MultipleNamedTensorErrors/shape",
     """{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"]},
                       {"int_tensor": [[[7,8],[9,0],[1,2]]], "str_tensor": ["baz", "bat"]}]}""",
     {"int_tensor": I32, "str_tensor": STR}, "Expecting shape"),
    ("MultipleNamedTensorErrors/size",
     """{"instances": [{"int_tensor": [[1,2],[3,4],[5,6],[7,8]], "str_tensor": ["foo", "bar"]},
                       {"int_tensor": [[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"]}]}""",
     {"int_tensor": I32, "str_tensor": STR}, "Expecting tensor size"),
    ("MultipleNamedTensorErrors/object_then_list",
     """{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"]}, [1, 20, 30],
                       {"int_tensor": [[[7,8],[9,0],[1,2]]], "str_tensor": ["baz", "bat"]}]}""",
     {"int_tensor": I32, "str_tensor": STR}, "Expecting object but got list"),
    ("MultipleNamedTensorErrors/list_then_object",
     '{"instances": [["baz", "bar"], {"str_tensor": ["baz", "bat"]}]}', {"str_tensor": STR},
     "Expecting value/list but got object"),
    ("TensorFromNonNullTerminatedBuffer/trailing_bytes", '{"instances": [[1,2],[3,4],[5,6]]}X', {"default": I32},
     "The document root must not be followed by other values. at offset: 34"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "dtypes", "text"), [r[1:] for r in ERRORS], ids=[r[0] for r in ERRORS])
def test_request_error(body: str, dtypes: dict[str, int], text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        doc = jt.loads(body.encode())
        jt.signature_name(doc)
        jt.tensors_from_request(doc, dtypes)
    assert text in info.value.message


# ---- response side: (id, tensors, format, exact body, the document TF's test expects) -----------------------------

_INT_2x3x2 = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2], np.int32).reshape(2, 3, 2)
_COLUMNAR_2x3x2 = (
    '{\n    "outputs": [\n'
    + ",\n".join(
        "        [\n"
        + ",\n".join(
            f"            [\n                {a},\n                {b}\n            ]" for a, b in item
        )
        + "\n        ]"
        for item in _INT_2x3x2.tolist()
    )
    + "\n    ]\n}"
)
_NESTED = "[[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]]"

RESPONSES: list[tuple[str, dict[str, np.ndarray], jt.Format, str, str]] = [
    ("FromJsonSingleTensor/row", {"int_tensor": _INT_2x3x2}, ROW,
     '{\n    "predictions": [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]\n    ]\n}',
     f'{{"predictions": {_NESTED}}}'),
    ("FromJsonSingleTensor/columnar", {"int_tensor": _INT_2x3x2}, COL, _COLUMNAR_2x3x2,
     f'{{"outputs": {_NESTED}}}'),
    ("FromJsonSingleScalarTensor/row", {"int_tensor": np.arange(1, 6, dtype=np.int32)}, ROW,
     '{\n    "predictions": [1, 2, 3, 4, 5\n    ]\n}', '{"predictions": [1, 2, 3, 4, 5]}'),
    ("FromJsonSingleScalarTensor/columnar", {"int_tensor": np.arange(1, 6, dtype=np.int32)}, COL,
     '{\n    "outputs": [\n        1,\n        2,\n        3,\n        4,\n        5\n    ]\n}',
     '{"outputs": [1, 2, 3, 4, 5]}'),
    ("FromJsonSingleFloatTensorSixDigitPrecision",
     {"float_tensor": np.array([[9000000, 999999, 0.5], [0.0003, 0.00003, 555557.5]], np.float32)}, ROW,
     '{\n    "predictions": [[9e+06, 999999.0, 0.5], [0.0003, 3e-05, 555557.5]\n    ]\n}',
     '{"predictions": [[9e+06, 999999.0, 0.5], [0.0003, 3e-05, 555557.5]]}'),
    ("FromJsonSingleFloatTensorNonFinite",
     {"float_tensor": np.array([[math.nan, math.inf], [3, -math.inf]], np.float32)}, ROW,
     '{\n    "predictions": [[NaN, Infinity], [3.0, -Infinity]\n    ]\n}',
     '{"predictions": [[NaN, Infinity], [3.0, -Infinity]]}'),
    ("FromJsonMultipleNamedTensors/numeric_row",
     {"int_tensor": _INT_2x3x2.reshape(2, 3, 2), "float_tensor": np.array([[1.0], [2.0]], np.float32),
      "double_scalar_tensor": np.array([8.0, 9.0])}, ROW,
     ('{\n    "predictions": [\n'
     '        {\n            "double_scalar_tensor": 8.0,\n            "float_tensor": [1.0],\n'
     '            "int_tensor": [[1, 2], [3, 4], [5, 6]]\n        },\n'
     '        {\n            "double_scalar_tensor": 9.0,\n            "float_tensor": [2.0],\n'
     '            "int_tensor": [[7, 8], [9, 0], [1, 2]]\n        }\n    ]\n}'),
     ('{"predictions": [{"double_scalar_tensor": 8.0, "float_tensor": [1.0], "int_tensor": [[1, 2], [3, 4], [5, 6]]},'
     ' {"double_scalar_tensor": 9.0, "float_tensor": [2.0], "int_tensor": [[7, 8], [9, 0], [1, 2]]}]}')),
    ("FromJsonSingleZeroBatchTensor", {"int_tensor": np.zeros((0, 2), np.int32)}, ROW,
     '{\n    "predictions": []\n}', '{"predictions": []}'),
    ("FromJsonMultipleZeroBatchTensors",
     {"str_tensor": np.zeros((0, 1, 2), object), "float_tensor": np.zeros((0, 3, 4), np.float32)}, ROW,
     '{\n    "predictions": []\n}', '{"predictions": []}'),
]  # fmt: skip


def _parse(text: str | bytes) -> Any:
    return json.loads(
        text, parse_constant=lambda c: {"NaN": "NaN", "Infinity": "inf", "-Infinity": "-inf"}[c]
    )


@pytest.mark.parametrize(
    ("outputs", "fmt", "body", "document"), [r[1:] for r in RESPONSES], ids=[r[0] for r in RESPONSES]
)
def test_response_bytes(outputs: dict[str, np.ndarray], fmt: jt.Format, body: str, document: str) -> None:
    got = jt.predict_response(outputs, fmt)
    assert got == body.encode()
    assert _parse(got) == _parse(document)
    assert jt._fast_predict(outputs, fmt, small=0) in (None, got)  # the numpy writer agrees where it applies


_HELLO = [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}]
_TF = [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}]
_STRINGS = {
    "int_tensor": _INT_2x3x2,
    "str_tensor": np.array([[b"foo", b"bar"], [b"baz", b"bat"]], object),
    "float_tensor": np.array([[1.0], [2.0]], np.float32),
    "double_scalar_tensor": np.array([8.0, 9.0]),
    "str_tensor_bytes": np.array([[b"hello", b"world"], [b"tf", b"serving"]], object),
}


def test_single_bytes_tensor() -> None:  # FromJsonSingleBytesTensor
    got = jt.predict_response({"str_tensor_bytes": _STRINGS["str_tensor_bytes"]}, ROW)
    assert _parse(got) == {"predictions": [_HELLO, _TF]}
    # a b64 object is a PrettyWriter object: its member on its own line even inside a single-line array
    assert got.startswith(b'{\n    "predictions": [[{\n                "b64": "aGVsbG8="\n            }, {')


def test_multiple_named_tensors_with_strings() -> None:  # FromJsonMultipleNamedTensors
    row = _parse(jt.predict_response(_STRINGS, ROW))
    assert row == {
        "predictions": [
            {"double_scalar_tensor": 8.0, "float_tensor": [1.0], "int_tensor": [[1, 2], [3, 4], [5, 6]],
             "str_tensor": ["foo", "bar"], "str_tensor_bytes": _HELLO},
            {"double_scalar_tensor": 9.0, "float_tensor": [2.0], "int_tensor": [[7, 8], [9, 0], [1, 2]],
             "str_tensor": ["baz", "bat"], "str_tensor_bytes": _TF},
        ]
    }  # fmt: skip
    col = _parse(jt.predict_response(_STRINGS, COL))
    assert col == {
        "outputs": {
            "double_scalar_tensor": [8.0, 9.0], "float_tensor": [[1.0], [2.0]],
            "int_tensor": json.loads(_NESTED), "str_tensor": [["foo", "bar"], ["baz", "bat"]],
            "str_tensor_bytes": [_HELLO, _TF],
        }
    }  # fmt: skip


@pytest.mark.parametrize(
    ("outputs", "text"),
    [
        ({}, "empty tensor map"),  # FromJsonSingleTensorErrors
        ({"tensor": np.array([1 + 2j, 3 + 4j], np.complex64)}, "tensor type: complex64"),
        ({"tensor": np.array(1, np.int32)}, "no shape information"),
        # FromJsonMultipleNamedTensorsErrors / FromJsonMultipleZeroBatchTensorsErrors
        ({"int_tensor": np.zeros((2, 3), np.int32), "str_tensor": np.zeros((1, 3), object)}, "inconsistent batch size"),
        ({"int_tensor": np.zeros((0, 2), np.int32), "str_tensor": np.zeros((1, 2), object)}, "inconsistent batch size"),
        # beyond TF's cases: the other dtypes JSON cannot carry
        ({"tensor": np.zeros(2, np.float16)}, "tensor type: half"),
        ({"tensor": np.zeros(2, np.uint16)}, "tensor type: uint16"),
    ],
)  # fmt: skip
def test_response_errors(outputs: dict[str, np.ndarray], text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        jt.predict_response(outputs, ROW)
    assert text in info.value.message


# ---- classify / regress requests: (id, method, body, expected Input in text format) -------------------------------

_NO_CONTEXT_BODY = """{"examples": [{"names": [ "foo", "bar" ], "ratings": [ 8.0, 9.0 ], "age": 20},
                                   {"names": [ "baz" ], "ratings": 6.0}]}"""
_NO_CONTEXT = """
example_list {
  examples { features {
    feature { key: "names" value { bytes_list { value: "foo" value: "bar" } } }
    feature { key: "ratings" value { float_list { value: 8 value: 9 } } }
    feature { key: "age" value { int64_list { value: 20 } } } } }
  examples { features {
    feature { key: "names" value { bytes_list { value: "baz" } } }
    feature { key: "ratings" value { float_list { value: 6 } } } } }
}"""
_CONTEXT_BODY = """{
  "signature_name": "custom_signture",
  "context": {"query": "pizza", "location": [ "sfo" ]},
  "examples": [
    {"names": [ "foo", "bar" ], "ratings": [ 8.0, 9.0, NaN, Infinity ], "age": 20},
    {"names": [ "baz", { "b64": "aGVsbG8=" } ], "ratings": 6.0, "intboolmix": [ 1, true, false ]},
    {"names": "bar", "ratings": -Infinity}
  ]}"""
_CONTEXT = """
example_list_with_context {
  context { features {
    feature { key: "query" value { bytes_list { value: "pizza" } } }
    feature { key: "location" value { bytes_list { value: "sfo" } } } } }
  examples { features {
    feature { key: "names" value { bytes_list { value: "foo" value: "bar" } } }
    feature { key: "ratings" value { float_list { value: 8 value: 9 value: nan value: inf } } }
    feature { key: "age" value { int64_list { value: 20 } } } } }
  examples { features {
    feature { key: "names" value { bytes_list { value: "baz" value: "hello" } } }
    feature { key: "ratings" value { float_list { value: 6 } } }
    feature { key: "intboolmix" value { int64_list { value: 1 value: 1 value: 0 } } } } }
  examples { features {
    feature { key: "names" value { bytes_list { value: "bar" } } }
    feature { key: "ratings" value { float_list { value: -inf } } } } }
}"""


@pytest.mark.parametrize("method", ["classify", "regress"])  # TF runs each case for both request types
@pytest.mark.parametrize(
    ("body", "expected", "signature"),
    [(_NO_CONTEXT_BODY, _NO_CONTEXT, ""), (_CONTEXT_BODY, _CONTEXT, "custom_signture")],
    ids=["RequestNoContext", "RequestWithContextAndSignature"],
)
def test_classify_regress_request(method: str, body: str, expected: str, signature: str) -> None:
    doc = jt.loads(body.encode())
    assert jt.signature_name(doc) == signature
    got = input_from_json(doc, method)
    want = text_format.Parse(expected, tfs_pb2.Input())
    assert text_format.MessageToString(got) == text_format.MessageToString(want)


CR_ERRORS: list[tuple[str, str, str]] = [
    ("signature_list", '{"signature_name": [ "hello" ], "examples": [ { "names": [ "foo", "bar" ] } ]}',
     "'signature_name' key must be a string"),
    ("context_list", '{"context": [ { "names": [ "foo", "bar" ] } ]}', "Example must be JSON object"),
    ("examples_object", '{"examples": { "names": [ "foo", "bar" ] }}', "list/array"),
    ("example_list", '{"examples": [ [ { "names": [ "foo", "bar" ] } ] ]}', "Example must be JSON object"),
    ("null", '{"examples": [ { "names": [ 10, null ] } ]}', "names has element with unexpected JSON type: Null"),
    ("int_then_float", '{"examples": [ { "names": [ 10, 10.0 ] } ]}', "feature: names expecting type: int64"),
    ("object", '{"examples": [ { "names": [ 10, { "test": 10 } ] } ]}',
     "names has element with unexpected JSON type: Object"),
    ("array", '{"examples": [ { "names": [ [10], 20 ] } ]}', "names has element with unexpected JSON type: Array"),
    ("uint64", '{"examples": [ { "names": [ 20, 18446744073709551603 ] } ]}', "Only int64_t is supported"),
    ("examples_double_max", '{"examples": [ { "names": 1.7976931348623157e308 } ]}', "loss of precision"),
]  # fmt: skip


@pytest.mark.parametrize("method", ["classify", "regress"])
@pytest.mark.parametrize(
    ("body", "text"), [r[1:] for r in CR_ERRORS], ids=[f"JsonErrors/{r[0]}" for r in CR_ERRORS]
)
def test_classify_regress_request_errors(method: str, body: str, text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        doc = jt.loads(body.encode())
        jt.signature_name(doc)
        input_from_json(doc, method)
    assert text in info.value.message


# ---- classify / regress results and error bodies --------------------------------------------------------------------


def test_classification_result() -> None:  # JsonFromClassificationResult
    got = jt.classify_response(
        [[("car", 0.2), ("bike", 0.7), ("bus", 0.1)], [("car", 0.7), ("bike", 0.1), ("bus", 0.2)]]
    )
    assert got == (
        b'{\n    "results": [[["car", 0.2], ["bike", 0.7], ["bus", 0.1]], [["car", 0.7], ["bike", 0.1], ["bus", 0.2]]'
        b"\n    ]\n}"
    )


@pytest.mark.parametrize(
    ("values", "body"),
    [
        ([0.2, 0.9, 1.0], b'{\n    "results": [0.2, 0.9, 1.0]\n}'),  # JsonFromRegressionResult
        (  # JsonFromRegressionResultWithNonFinite
            [0.2, math.inf, 1.0, -math.inf, math.nan],
            b'{\n    "results": [0.2, Infinity, 1.0, -Infinity, NaN]\n}',
        ),
    ],
)
def test_regression_result(values: list[float], body: bytes) -> None:
    assert jt.regress_response(values) == body


def test_result_errors() -> None:  # JsonFromResultErrors
    with pytest.raises(InvalidArgument, match="empty ClassificationResults"):
        jt.classify_response([])
    with pytest.raises(InvalidArgument, match="empty RegressionResults"):
        jt.regress_response([])


@pytest.mark.parametrize(  # MakeJsonFromTensors.StatusError
    ("message", "body"),
    [
        ('Bad key: "key"', b'{\n    "error": "Bad key: \\"key\\""\n}'),
        ("Bad key: 'key'", b'{\n    "error": "Bad key: \'key\'"\n}'),
    ],
)
def test_status_error_body(message: str, body: bytes) -> None:
    assert jt.error_body(message) == body
