"""Native JSON response writer (``embedgate_native`` via ``gateway.native``) vs the Python reference writer.

The reference is ``json_tensor._reference_predict`` (value by value through the rapidjson ``PrettyWriter`` model,
``numbers.format_float``) and ``json_tensor.predict_response`` (its numpy fast path); the native writer must give the
same bytes for every generated output map (hypothesis over dtypes, ranks, empty dims, names, float edge values:
subnormals, -0.0, 1e16, float32/float64 max and min, NaN/Infinity, strings with control and non-ASCII bytes,
``*_bytes`` outputs), the same error text where the reference refuses, TF Serving's golden bodies (the conformance
cases of ``tests/gateway/codec/test_tfs_json_tensor_cases.py``), and the same classify/regress bodies. The REST
route's writer (``rest_codec.predict_json``) is checked both ways (``EMBEDGATE_NATIVE=off`` and on).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gateway import native
from gateway.codec import json_tensor as jt
from gateway.codec.numbers import format_float
from gateway.errors import GatewayError
from schemas.tensors import from_ndarray
from tests.gateway.codec.test_tfs_json_tensor_cases import _STRINGS, RESPONSES

pytestmark = pytest.mark.skipif(not native.available(), reason="embedgate_native is not built (make install)")


@pytest.fixture(autouse=True, scope="module")
def _native_on() -> Iterator[None]:
    """The native path on whatever ``EMBEDGATE_NATIVE`` the suite runs with: these tests compare it with the
    reference (a suite run with ``off`` still checks the native writer here)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(native.ENV, "auto")
        yield


ROW, COL = jt.Format.ROW, jt.Format.COLUMNAR

_F32_EDGES = [
    0.0, -0.0, 1e16, -1e16, 1.4e-45, -1.4e-45, 1.17549435e-38, 3.4028235e38, -3.4028235e38, 0.1, 1e-5, 9e6,
    999999.5, 1234565.0, 555557.5, 16777217.0, math.nan, math.inf, -math.inf,
]  # fmt: skip
_F64_EDGES = [
    0.0, -0.0, 1e16, 1e-16, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308,
    1000000000000000.25, 0.1, 1e22, 1e23, 9007199254740993.0, math.nan, math.inf, -math.inf,
]  # fmt: skip


def _floats(dtype: Any) -> st.SearchStrategy[float]:
    if dtype == np.float32:
        return st.one_of(st.floats(width=32), st.sampled_from(_F32_EDGES))
    return st.one_of(st.floats(width=64), st.sampled_from(_F64_EDGES))


_NUMERIC = [
    np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64, np.bool_,
]  # fmt: skip
_STRING_KINDS = ["object_bytes", "object_str", "S"]
_NAMES = st.text(st.sampled_from('ab_/"\\\n\x01é'), min_size=1, max_size=5)


def _array(draw: Any, kind: Any, shape: tuple[int, ...]) -> np.ndarray:
    if kind in _STRING_KINDS:
        size = math.prod(shape)
        if kind == "object_str":
            items: list[Any] = draw(st.lists(st.text(max_size=4), min_size=size, max_size=size))
        else:
            items = draw(st.lists(st.binary(max_size=5), min_size=size, max_size=size))
        if kind == "S":
            items = [x.rstrip(b"\0") for x in items]  # numpy's S dtype drops trailing NULs
            return np.array(items, dtype="S5").reshape(shape) if items else np.zeros(shape, "S5")
        arr = np.empty(size, object)
        arr[:] = items
        return arr.reshape(shape)
    elements = _floats(kind) if np.dtype(kind).kind == "f" else None
    result: np.ndarray = draw(hnp.arrays(kind, shape, elements=elements))
    return result


@st.composite
def _outputs(draw: Any, allow_bad: bool = False) -> dict[str, np.ndarray]:
    count = draw(st.integers(1, 3))
    names = draw(st.lists(_NAMES, min_size=count, max_size=count, unique=True))
    if draw(st.booleans()):
        names[0] = names[0] + "_bytes"
    batch = draw(st.integers(0, 4))
    out = {}
    for name in names:
        rest = tuple(draw(st.lists(st.integers(0 if allow_bad else 1, 3), max_size=3)))
        shape = (draw(st.integers(0, 4)) if allow_bad else batch, *rest)
        if allow_bad and draw(st.integers(0, 9)) == 0:
            shape = ()
        kind = draw(st.sampled_from([*_NUMERIC, *_STRING_KINDS]))
        out[name] = _array(draw, kind, shape)
    if allow_bad and draw(st.integers(0, 9)) == 0:
        out["half"] = np.zeros(2, np.float16)
    return out


def _outcome(write: Any, *args: Any) -> bytes | str | None:
    """What ``write(*args)`` gives: the body (None when declined) or the error's class and text."""
    try:
        result: bytes | None = write(*args)
        return result
    except GatewayError as exc:
        return f"{type(exc).__name__}: {exc.message}"


@settings(max_examples=300, deadline=None)
@given(_outputs(), st.sampled_from([ROW, COL]))
def test_generated_outputs_same_bytes(outputs: dict[str, np.ndarray], fmt: jt.Format) -> None:
    got = native.predict_response(outputs, fmt)
    assert got is not None, "the native writer declined a writable output map"
    assert got == jt._reference_predict(outputs, fmt)
    assert got == jt.predict_response(outputs, fmt)


@settings(max_examples=200, deadline=None)
@given(_outputs(allow_bad=True), st.sampled_from([ROW, COL]))
def test_generated_outputs_same_bytes_or_error(outputs: dict[str, np.ndarray], fmt: jt.Format) -> None:
    want = _outcome(jt.predict_response, outputs, fmt)
    assert _outcome(native.predict_response, outputs, fmt) == want


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([np.float32, np.float64]).flatmap(
        lambda d: hnp.arrays(d, st.integers(64, 300), elements=_floats(d))
    )
)
def test_large_float_outputs_same_as_numpy_fast_path(arr: np.ndarray) -> None:
    outputs = {"y": arr.reshape(-1, 2) if arr.size % 2 == 0 else arr}
    for fmt in (ROW, COL):
        assert native.predict_response(outputs, fmt) == jt.predict_response(outputs, fmt)


def test_random_bit_patterns_format_as_reference() -> None:
    import embedgate_native

    rng = np.random.default_rng(2026)
    with np.errstate(invalid="ignore"):
        f32 = rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f64 = rng.integers(0, 2**63, 20_000, dtype=np.int64).view(np.float64)
    assert [embedgate_native.format_float(v) for v in f32.tolist()] == [format_float(v) for v in f32.tolist()]
    assert [embedgate_native.format_float(v, True) for v in f64.tolist()] == [
        format_float(v, double=True) for v in f64.tolist()
    ]


def _short_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values with few significant digits (the writer's six-digit shortcut), near powers of ten and two."""
    digits = rng.integers(1, 10, n)
    mant = np.array(
        [round(m, int(d) - 1) for m, d in zip(rng.uniform(1, 10, n).tolist(), digits.tolist(), strict=True)]
    )
    exps = rng.integers(-40, 40, n).astype(np.float64)
    near = np.concatenate([10.0 ** np.arange(-38, 39), 2.0 ** np.arange(-126, 128)])
    return np.concatenate([mant * 10.0**exps, near, np.nextafter(near, 0), np.nextafter(near, np.inf)])


def test_float_shortcuts_agree_with_the_rule() -> None:
    """The native writer's shortcuts (shortest digits, float64 scaling) against the rule as defined (exact=True)
    and against the reference, on short decimals, powers of ten and two and their neighbours, both widths."""
    import embedgate_native

    values = _short_values(np.random.default_rng(7), 20_000)
    with np.errstate(over="ignore"):
        f32 = values.astype(np.float32).tolist()
    for v in f32:
        assert (
            embedgate_native.format_float(v)
            == embedgate_native.format_float(v, exact=True)
            == format_float(v)
        )
    for v in values.tolist():
        want = format_float(v, double=True)
        assert embedgate_native.format_float(v, True) == embedgate_native.format_float(v, True, True) == want


@pytest.mark.parametrize(
    ("outputs", "fmt", "body"), [r[1:4] for r in RESPONSES], ids=[r[0] for r in RESPONSES]
)
def test_tfs_golden_bodies(outputs: dict[str, np.ndarray], fmt: jt.Format, body: str) -> None:
    assert native.predict_response(outputs, fmt) == body.encode()


@pytest.mark.parametrize("fmt", [ROW, COL])
def test_tfs_strings_and_b64(fmt: jt.Format) -> None:
    assert native.predict_response(_STRINGS, fmt) == jt._reference_predict(_STRINGS, fmt)
    single = {"str_tensor_bytes": _STRINGS["str_tensor_bytes"]}
    assert native.predict_response(single, fmt) == jt._reference_predict(single, fmt)


@pytest.mark.parametrize(
    "outputs",
    [
        {},
        {"t": np.array([1 + 2j], np.complex64)},
        {"t": np.array(1, np.int32)},
        {"a": np.zeros((2, 3), np.int32), "b": np.zeros((1, 3), object)},
        {"t": np.zeros(2, np.float16)},
        {"t": np.zeros(2, np.uint16)},
    ],
)
def test_errors_are_the_references(outputs: dict[str, np.ndarray]) -> None:
    assert _outcome(native.predict_response, outputs, ROW) == _outcome(jt.predict_response, outputs, ROW)
    assert str(_outcome(native.predict_response, outputs, ROW)).startswith("InvalidArgument: ")


def test_unusual_layouts_are_written_or_left_to_the_reference() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    for arr in (base.T, base[:, ::2], base.astype(">f4"), base.astype(np.longdouble)):
        outputs = {"y": arr}
        got = native.predict_response(outputs, COL)
        assert got in (None, jt.predict_response(outputs, COL))
    assert native.predict_response({"y": base.T}, COL) is not None  # non-contiguous: copied, written natively


@settings(max_examples=100, deadline=None)
@given(st.lists(_floats(np.float32), max_size=20))
def test_regress_same_bytes(values: list[float]) -> None:
    assert _outcome(native.regress_response, values) == _outcome(jt.regress_response, values)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.text(max_size=4), _floats(np.float32)), max_size=4), max_size=4))
def test_classify_same_bytes(results: list[list[tuple[str, float]]]) -> None:
    assert _outcome(native.classify_response, results) == _outcome(jt.classify_response, results)


def test_facade_respects_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = {"y": np.ones((2, 1), np.float32)}
    monkeypatch.setenv(native.ENV, "off")
    assert native.predict_response(outputs, ROW) is None
    assert native.regress_response([1.0]) is None
    assert native.classify_response([[("a", 1.0)]]) is None
    monkeypatch.setenv(native.ENV, "auto")
    assert native.predict_response(outputs, ROW) == jt.predict_response(outputs, ROW)


@pytest.mark.parametrize("fmt", [ROW, COL])
def test_rest_route_writer_same_both_ways(fmt: jt.Format, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.core.requests import PredictResult
    from gateway.routes.rest_codec import predict_json

    outputs = {n: from_ndarray(a) for n, a in _STRINGS.items()}
    outputs["big"] = from_ndarray(np.linspace(-3, 3, 2 * 500, dtype=np.float32).reshape(2, 500))
    result = PredictResult(outputs, None, "serving_default")
    bodies = []
    for mode in ("off", "auto"):
        monkeypatch.setenv(native.ENV, mode)
        bodies.append(predict_json(result, fmt))
    assert bodies[0] == bodies[1]
