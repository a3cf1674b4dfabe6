"""Native (``embedgate_native`` via ``gateway.native``) vs the Python reference for REST predict bodies.

For every body, generated (hypothesis: nested lists of number/boolean/string/null literals written in many
spellings, row and columnar, one or several inputs, then randomly cut or altered) or from the fuzz corpus (TF
Serving's json_tensor cases replayed in ``tests/gateway/codec/test_tfs_json_tensor_cases.py``): when the native path
answers, the reference accepts the body and gives the same format and arrays (dtype, shape, bytes); when it does
not, the gateway runs the reference, so the texts of errors are the reference's. Well-formed numeric bodies must
be answered natively (else the native path would silently be dead).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.codec import json_tensor as jt
from gateway.errors import GatewayError
from schemas.gateway_settings import LimitsSettings
from schemas.proto import tfs_pb2
from tests.gateway.codec.test_tfs_json_tensor_cases import ERRORS, REQUESTS

pytestmark = pytest.mark.skipif(not native.available(), reason="embedgate_native is not built (make install)")

DT = tfs_pb2.DataType
NUMERIC = [
    DT.DT_FLOAT, DT.DT_DOUBLE, DT.DT_INT32, DT.DT_INT16, DT.DT_INT8, DT.DT_UINT8, DT.DT_INT64, DT.DT_UINT32,
    DT.DT_UINT64, DT.DT_BOOL,
]  # fmt: skip
ALL_DTYPES = [*NUMERIC, DT.DT_STRING]


def _reference(body: bytes, dtypes: dict[str, int]) -> tuple[dict[str, np.ndarray], jt.Format] | str:
    try:
        doc = jt.loads(body)
        jt.signature_name(doc)
        return jt.tensors_from_request(doc, dtypes)
    except GatewayError as exc:
        return exc.message


def _native(body: bytes, dtypes: dict[str, int]) -> tuple[dict[str, np.ndarray], jt.Format] | None:
    import embedgate_native

    names = sorted(dtypes)
    done = embedgate_native.predict_tensors(body, names, [dtypes[n] for n in names])
    return None if done is None else (done[0], jt.Format(done[1]))


def check_same(body: bytes, dtypes: dict[str, int]) -> bool:
    """Asserts native == reference where native answers; True when it answered."""
    got = _native(body, dtypes)
    if got is None:
        return False
    want = _reference(body, dtypes)
    assert not isinstance(want, str), f"native typed a body the reference refuses ({want}): {body[:200]!r}"
    assert got[1] is want[1]
    assert sorted(got[0]) == sorted(want[0])
    for name, arr in want[0].items():
        mine = got[0][name]
        assert mine.dtype == arr.dtype, (name, mine.dtype, arr.dtype, body[:200])
        assert mine.shape == arr.shape, (name, mine.shape, arr.shape, body[:200])
        assert mine.tobytes() == arr.tobytes(), (name, mine, arr, body[:200])
    return True


# ---- the corpus ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "dtypes"), [(r[1], r[2]) for r in REQUESTS], ids=[r[0] for r in REQUESTS])
def test_tfs_cases_agree(body: str, dtypes: dict[str, int]) -> None:
    answered = check_same(body.encode(), dtypes)
    if all(d in NUMERIC for d in dtypes.values()) and "NaN" not in body and "Inf" not in body:
        assert answered, "a well-formed numeric body was left to the reference"


@pytest.mark.parametrize(("body", "dtypes"), [(r[1], r[2]) for r in ERRORS], ids=[r[0] for r in ERRORS])
def test_tfs_error_cases_are_left_to_the_reference(body: str, dtypes: dict[str, int]) -> None:
    assert _native(body.encode(), dtypes) is None


CORPUS: list[tuple[str, dict[str, int]]] = [
    ('{"instances": [1, 2, 3]}', {"x": DT.DT_FLOAT}),
    ('{"instances": [-0, 0, -0.0]}', {"x": DT.DT_FLOAT}),
    ('{"instances": [-0]}', {"x": DT.DT_INT32}),
    ('{"instances": [2147483648]}', {"x": DT.DT_INT32}),
    ('{"instances": [-1]}', {"x": DT.DT_UINT32}),
    ('{"instances": [18446744073709551615, 0]}', {"x": DT.DT_UINT64}),
    ('{"instances": [18446744073709551616]}', {"x": DT.DT_DOUBLE}),
    ('{"instances": [1e400]}', {"x": DT.DT_FLOAT}),
    ('{"instances": [3.4028235677973366e38, 1e39, 16777217, 0.1]}', {"x": DT.DT_FLOAT}),
    ('{"instances": [NaN, Infinity]}', {"x": DT.DT_FLOAT}),
    ('{"instances": [true, false]}', {"x": DT.DT_BOOL}),
    ('{"instances": [true, 1]}', {"x": DT.DT_INT32}),
    ('{"instances": [[], []]}', {"x": DT.DT_INT64}),
    (
        '{"instances": [{"a": [1, 2], "b": 3.5}, {"a": [3, 4], "b": 1}]}',
        {"a": DT.DT_INT64, "b": DT.DT_DOUBLE},
    ),
    ('{"instances": [{"a": [1, 2], "b": 3.5}, {"a": [3], "b": 1}]}', {"a": DT.DT_INT64, "b": DT.DT_DOUBLE}),
    ('{"instances": [{"a": 1, "a": 2}]}', {"a": DT.DT_INT64}),
    ('{"instances": [{"b64": "AA=="}]}', {"a": DT.DT_INT64}),
    ('{"inputs": {"a": [[1, 2]], "b": 5, "extra": "x"}}', {"a": DT.DT_INT32, "b": DT.DT_FLOAT}),
    ('{"inputs": 5}', {"a": DT.DT_INT32}),
    ('{"inputs": [[1, 2], [3]]}', {"a": DT.DT_INT32}),
    ('{"inputs": [[1, 2], [3, 4]], "signature_name": 1}', {"a": DT.DT_INT32}),
    ('{"inputs": [1], "instances": [1]}', {"a": DT.DT_INT32}),
    ('{"instances": []}', {"a": DT.DT_INT32}),
    ('  {"instances": [1]}  \n', {"a": DT.DT_INT32}),
    ('{"instances": [1]} x', {"a": DT.DT_INT32}),
    ('{"instances": ["\\ud800"]}', {"a": DT.DT_STRING}),
    ("[1]", {"a": DT.DT_INT32}),
]


@pytest.mark.parametrize(("body", "dtypes"), CORPUS)
def test_corpus_agrees(body: str, dtypes: dict[str, int]) -> None:
    check_same(body.encode(), dtypes)


def test_corpus_numeric_bodies_are_answered_natively() -> None:
    assert check_same(CORPUS[0][0].encode(), CORPUS[0][1])
    assert check_same(CORPUS[8][0].encode(), CORPUS[8][1])
    assert check_same(CORPUS[13][0].encode(), CORPUS[13][1])
    assert check_same(CORPUS[17][0].encode(), CORPUS[17][1])


# ---- generated bodies ---------------------------------------------------------------------------------------------

_INT_EDGES = [0, 1, -1, 127, 255, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32 - 1, 2**32, 2**53 + 1,
              2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**30]  # fmt: skip
_literal = st.one_of(
    st.sampled_from(_INT_EDGES).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(lambda f: f"{f:.9e}"),
    st.sampled_from(["-0", "-0.0", "0.0", "1E5", "1e-400", "1e400", "-1e400", "0.1", "NaN", "-Infinity"]),
    st.sampled_from(["true", "false", "null", '"s"', '{"b64": "AA=="}', '{"b64": 1}', "{}"]),
)


def _tensor(depth: int) -> st.SearchStrategy[str]:
    """JSON text of a (mostly rectangular) nested list of literals."""
    if depth == 0:
        return _literal
    inner = _tensor(depth - 1)
    rect = st.tuples(st.integers(0, 4), inner).map(lambda t: "[" + ", ".join([t[1]] * t[0]) + "]")
    ragged = st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
    return st.one_of(inner, rect, ragged)


_names = st.lists(st.sampled_from(["a", "b", "x_1"]), min_size=1, max_size=3, unique=True)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, dict[str, int]]:
    names = draw(_names)
    dtypes: dict[str, int] = {n: int(draw(st.sampled_from(ALL_DTYPES))) for n in names}
    value = _tensor(draw(st.integers(0, 3)))
    n = draw(st.integers(0, 4))
    kind = draw(st.sampled_from(["row_objects", "row_plain", "columnar_object", "columnar_plain"]))
    if kind == "row_objects":
        keys = draw(st.lists(st.sampled_from([*names, "zz"]), min_size=1, max_size=4))
        items = []
        for _ in range(n):
            members = [f"{json.dumps(k)}: {draw(value)}" for k in (keys if draw(st.booleans()) else names)]
            items.append("{" + ", ".join(members) + "}")
        text = '{"instances": [' + ", ".join(items) + "]}"
    elif kind == "row_plain":
        text = '{"instances": [' + ", ".join(draw(value) for _ in range(n)) + "]}"
    elif kind == "columnar_object":
        keys = draw(st.lists(st.sampled_from([*names, "zz"]), max_size=4)) if draw(st.booleans()) else names
        text = '{"inputs": {' + ", ".join(f"{json.dumps(k)}: {draw(value)}" for k in keys) + "}}"
    else:
        text = '{"inputs": ' + draw(value) + "}"
    if draw(st.booleans()):
        text = (
            text[:-1] + ', "signature_name": ' + draw(st.sampled_from(['"serving_default"', "1", '""'])) + "}"
        )
    body = text.encode()
    mutation = draw(st.sampled_from(["none", "none", "cut", "byte"]))
    if mutation == "cut" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif mutation == "byte" and body:
        i = draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([draw(st.integers(0, 255))]) + body[i + 1 :]
    return body, dtypes


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_generated_bodies_agree(case: tuple[bytes, dict[str, int]]) -> None:
    check_same(*case)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=3, max_size=3), min_size=1, max_size=20),
    st.sampled_from([DT.DT_INT32, DT.DT_INT64, DT.DT_FLOAT, DT.DT_DOUBLE]),
)
def test_well_formed_numeric_rows_are_native(rows: list[list[int]], dtype: int) -> None:
    body = json.dumps({"instances": rows}).encode()
    assert check_same(body, {"x": dtype})


def test_facade_respects_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    body, dtypes = b'{"instances": [1, 2]}', {"x": DT.DT_INT32}
    monkeypatch.setenv(native.ENV, "off")
    assert native.path() == "reference"
    assert native.predict_tensors(body, dtypes) is None
    monkeypatch.setenv(native.ENV, "auto")
    assert native.path() == "native"
    got = native.predict_tensors(body, dtypes)
    assert got is not None and got[1] is jt.Format.ROW and got[0]["x"].tolist() == [1, 2]


@pytest.mark.parametrize(
    "body",
    [
        b'{"instances": [{"a": [1, 2], "b": 0.5}, {"a": [3, 4], "b": 2}]}',
        b'{"inputs": {"a": [[1, 2]], "b": [1.5]}, "signature_name": "serving_default"}',
        b'{"instances": [{"a": [1, 2], "b": NaN}]}',
    ],
)
def test_rest_predict_wiring_same_both_ways(body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """The REST predict route's typed inputs (``parse_predict`` -> ``JsonInputs.tensors``) with the native path on
    and forced off: the same TensorProtos and format."""
    from gateway.core.requests import VersionSpec
    from gateway.limits import parse_document
    from gateway.routes.rest_codec import parse_predict
    from schemas.gateway_settings import LimitsSettings

    dtypes = {"a": DT.DT_INT64, "b": DT.DT_FLOAT}
    results = []
    for mode in ("off", "auto"):
        monkeypatch.setenv(native.ENV, mode)
        _, inputs = parse_predict("m", VersionSpec(), parse_document(body, LimitsSettings()), body)
        results.append(({k: t.SerializeToString() for k, t in inputs.tensors(dtypes).items()}, inputs.format))
    assert results[0] == results[1]


# ---- the one-pass check (native.check_predict vs gateway.limits.parse_document) -------------------------------------


def _limits(depth: int, instances: int, ids: int) -> LimitsSettings:
    return LimitsSettings(max_json_depth=depth, max_instances=instances, max_ids_per_feature=ids)


def check_same_check(body: bytes, limits: LimitsSettings) -> bool:
    """When the native check passes a body, the reference checks pass too and give the same signature_name."""
    from gateway.limits import parse_document

    done = native.check_predict(body, limits)
    if done is None:
        return False
    sig, checked = done
    try:
        doc = parse_document(body, limits)
        want = jt.signature_name(doc)
    except GatewayError as exc:
        raise AssertionError(
            f"native passed a body the reference refuses ({exc.message}): {body[:200]!r}"
        ) from None
    assert sig == want
    # typing the kept parse gives what typing the raw body gives, for a few signatures
    for dtypes in ({"a": DT.DT_FLOAT}, {"a": DT.DT_INT64, "b": DT.DT_DOUBLE}, {"x": DT.DT_BOOL}):
        from_body = native.predict_tensors(body, dtypes)
        from_checked = native.checked_tensors(checked, dtypes)
        assert (from_body is None) == (from_checked is None)
        if from_body is not None and from_checked is not None:
            assert from_body[1] is from_checked[1]
            assert {k: (a.dtype, a.shape, a.tobytes()) for k, a in from_body[0].items()} == {
                k: (a.dtype, a.shape, a.tobytes()) for k, a in from_checked[0].items()
            }
    return True


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), st.integers(2, 6), st.integers(1, 5), st.integers(1, 5))
def test_generated_bodies_checks_agree(
    case: tuple[bytes, dict[str, int]], depth: int, n: int, ids: int
) -> None:
    check_same_check(case[0], _limits(depth, n, ids))


@pytest.mark.parametrize(
    ("body", "limits", "passes"),
    [
        (b'{"instances": [[1, 2], [3, 4]]}', (3, 2, 2), True),
        (b'{"instances": [[1, 2], [3, 4]], "signature_name": "s"}', (3, 2, 2), True),
        (b'{"instances": [[1, 2], [3, 4]]}', (2, 2, 2), False),  # depth
        (b'{"instances": [[1, 2], [3, 4]]}', (3, 1, 2), False),  # batch
        (b'{"instances": [[1, 2, 3]]}', (3, 2, 2), False),  # per-example list
        (b'{"instances": [{"a": [1, 2, 3]}]}', (3, 2, 2), False),
        (b'{"examples": [1, 2, 3]}', (3, 2, 2), False),
        (b'{"inputs": [1, 2, 3]}', (3, 2, 2), False),
        (b'{"inputs": {"a": [1, 2, 3]}}', (3, 2, 2), False),
        (b'{"inputs": {"a": [[1, 2, 3]]}}', (3, 2, 2), False),
        (b'{"inputs": {"a": [1]}, "context": {"c": [1, 2, 3]}}', (3, 2, 2), False),
        (b'{"instances": [NaN]}', (3, 2, 2), False),
        (b'{"instances": ["\\ud800"]}', (3, 2, 2), False),
        (b'{"instances": [1], "signature_name": 5}', (3, 2, 2), False),
        (b'{"instances": [1]} {}', (3, 2, 2), False),
    ],
)
def test_check_limits(
    body: bytes, limits: tuple[int, int, int], passes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        native.ENV, "auto"
    )  # the native check itself, also in a suite run with EMBEDGATE_NATIVE=off
    assert check_same_check(body, _limits(*limits)) is passes


@pytest.mark.parametrize(("mode", "expected"), [("off", "reference"), ("auto", "native")])
async def test_startup_log_names_the_path(
    mode: str, expected: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway's ``gateway started`` line says which REST codec path serves requests."""
    from tests.gateway.conftest import app_client
    from tests.support.ports import free_port

    monkeypatch.setenv(native.ENV, mode)
    caplog.set_level("INFO", logger="embedgate.gateway")
    models = [{"kind": "passthrough", "name": "m", "target": f"127.0.0.1:{free_port()}"}]
    async with app_client(models=models):
        pass
    started = [r for r in caplog.records if r.getMessage() == "gateway started"]
    assert len(started) == 1
    assert getattr(started[0], "rest_codec", None) == expected
    # and what makes the backend Predict calls (tests/gateway/test_native_client.py)
    assert getattr(started[0], "backend_client", None) == ("native" if expected == "native" else "grpc.aio")
