"""gateway.features: the column fast path and the per-value path give exactly the same batches and the same errors.

The slow path is forced by disabling the fast functions; inputs are drawn from well-formed examples with random
defects (wrong types, bools, floats as ids, values beyond int64/double/float32, NaN weights, wrong lengths, missing,
unknown or partial keys) so both branches of every fast-path check run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import features
from gateway.errors import InvalidArgument
from gateway.features import FeatureBatch, batch_from_columns, batch_from_instances
from tests.gateway.feature_cases import MANIFEST, ODD, defect

_ID = st.integers(-(2**63), 2**63 - 1) | st.integers(0, 50)
_WEIGHT = st.floats(-4, 4, width=32) | st.integers(-3, 3)
_DENSE = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70)
# a leaf that is wrong somewhere (or, for some features, still fine: both paths must agree either way)
_WELL_FORMED = st.fixed_dictionaries(
    {
        "user": _ID,
        "item": _ID,
        "genres": st.lists(_ID, max_size=5),
        "tags": st.lists(_ID, max_size=8),
        "age": _DENSE,
        "ctx": st.lists(_DENSE, min_size=2, max_size=2),
    }
)


@st.composite
def _well_formed(draw: st.DrawFn) -> dict[str, Any]:
    ex = draw(_WELL_FORMED)
    if draw(st.booleans()):
        ex["item_w"] = draw(_WEIGHT)
    if draw(st.booleans()):
        ex["genres_w"] = draw(st.lists(_WEIGHT, min_size=len(ex["genres"]), max_size=len(ex["genres"])))
    return ex


@st.composite
def _example(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed example, half of the time with one defect: a value or a list element replaced by an odd
    leaf, a list made longer or shorter, a key dropped or an unknown key added."""
    ex = draw(_well_formed())
    if draw(st.booleans()):
        return ex
    defect(draw, ex, ODD)
    return ex


def _slow(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], FeatureBatch]) -> FeatureBatch:
    with monkeypatch.context() as m:
        m.setattr(features, "_fast_batch", lambda *a: None)
        return fn()


def _outcome(fn: Callable[[], FeatureBatch]) -> FeatureBatch | str:
    try:
        return fn()
    except InvalidArgument as exc:
        return f"{exc.code.name}: {exc.message}"


def _bits(a: np.ndarray | None) -> tuple[str, tuple[int, ...], bytes] | None:
    return None if a is None else (a.dtype.str, a.shape, a.tobytes())


def _same(fast: FeatureBatch | str, slow: FeatureBatch | str) -> None:
    if isinstance(slow, str) or isinstance(fast, str):
        assert fast == slow
        return
    assert fast.size == slow.size
    assert fast.sparse.keys() == slow.sparse.keys() and fast.dense.keys() == slow.dense.keys()
    for name, s in slow.sparse.items():
        f = fast.sparse[name]
        for part in ("ids", "row_splits", "weights"):
            assert _bits(getattr(f, part)) == _bits(getattr(s, part)), (name, part)
    for name, s in slow.dense.items():
        assert _bits(fast.dense[name]) == _bits(s), name


def _columns(examples: list[dict[str, Any]]) -> dict[str, Any]:
    names = sorted({k for e in examples for k in e})
    return {k: [e.get(k) for e in examples] for k in names}


def _check(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], FeatureBatch]) -> FeatureBatch | str:
    fast = _outcome(fn)
    slow = _outcome(lambda: _slow(monkeypatch, fn))
    _same(fast, slow)
    return fast


_SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(st.lists(_example(), min_size=1, max_size=5))
def test_rows_fast_and_slow_agree(monkeypatch: pytest.MonkeyPatch, examples: list[dict[str, Any]]) -> None:
    _check(monkeypatch, lambda: batch_from_instances(examples, MANIFEST))


@_SETTINGS
@given(st.lists(_example(), min_size=1, max_size=5))
def test_columns_fast_and_slow_agree(monkeypatch: pytest.MonkeyPatch, examples: list[dict[str, Any]]) -> None:
    cols = _columns(examples)
    _check(monkeypatch, lambda: batch_from_columns(cols, MANIFEST))


@_SETTINGS
@given(st.lists(_well_formed(), min_size=1, max_size=8))
def test_well_formed_rows_take_the_fast_path(
    monkeypatch: pytest.MonkeyPatch, examples: list[dict[str, Any]]
) -> None:
    """Uniform well-formed rows never reach the per-value path (and agree with it)."""
    uniform = [dict(e) for e in examples]
    for key in ("item_w", "genres_w"):
        if not all(key in e for e in uniform):
            for e in uniform:
                e.pop(key, None)
    got = _check(monkeypatch, lambda: batch_from_instances(uniform, MANIFEST))
    finite_weights = all(
        abs(float(w)) <= 3.4e38 for e in uniform for w in [e.get("item_w", 0), *e.get("genres_w", [])]
    )
    if not isinstance(got, str) and finite_weights:
        with monkeypatch.context() as m:
            m.setattr(features, "_Builder", None)  # the slow path would fail loudly
            _same(batch_from_instances(uniform, MANIFEST), got)


def test_mixed_weights_fall_back_and_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        {"user": 1, "item": 2, "item_w": 0.5, "genres": [3], "tags": [], "age": 1.0, "ctx": [1, 2]},
        {"user": 1, "item": 2, "genres": [3, 4], "tags": [5], "age": 2, "ctx": [3, 4]},
    ]
    got = _check(monkeypatch, lambda: batch_from_instances(rows, MANIFEST))
    assert not isinstance(got, str)
    weights = got.sparse["item"].weights
    assert weights is not None and weights.tolist() == [0.5, 1.0]


def test_errors_name_the_value_after_a_fast_path_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"user": 1, "item": True, "genres": [], "tags": [], "age": 1, "ctx": [1, 2]}]
    got = _check(monkeypatch, lambda: batch_from_instances(rows, MANIFEST))
    assert got == (
        "INVALID_ARGUMENT: feature 'item' at example 0: expected one int64 id (an integer or a one-element list), "
        "got true"
    )
