"""gateway.features: every request form gives the same FeatureBatch; every bad input names feature and example."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.codec.example import input_from_json
from gateway.errors import InvalidArgument
from gateway.features import (
    FeatureBatch,
    batch_from_columns,
    batch_from_input,
    batch_from_instances,
    client_signature,
)
from schemas.proto import tfs_pb2
from tests.gateway.feature_cases import MANIFEST

tf = pytest.importorskip("tensorflow")

REPO = Path(__file__).resolve().parents[2]

# -- the data model used to render every form -------------------------------------------------------------------------

_ID = st.integers(-(2**63), 2**63 - 1) | st.integers(0, 50)
_WEIGHT = st.floats(-4, 4, width=32)
_DENSE = st.floats(width=32, allow_nan=True, allow_infinity=True)


@st.composite
def _example(draw: st.DrawFn) -> dict[str, Any]:
    genres = draw(st.lists(_ID, max_size=5))
    return {
        "user": draw(_ID),
        "item": draw(_ID),
        "item_w": draw(st.none() | _WEIGHT),
        "genres": genres,
        "genres_w": draw(st.none() | st.lists(_WEIGHT, min_size=len(genres), max_size=len(genres))),
        "tags": draw(st.lists(_ID, max_size=8)),
        "age": draw(_DENSE),
        "ctx": draw(st.lists(_DENSE, min_size=2, max_size=2)),
    }


_EXAMPLES = st.lists(_example(), min_size=1, max_size=6)


def _row_json(ex: dict[str, Any], bare: bool) -> dict[str, Any]:
    """Row-format instance; ``bare`` picks the bare-number forms (single ids, dim-1 dense, single weight)."""
    row = {
        "user": ex["user"] if bare else [ex["user"]],
        "item": ex["item"] if bare else [ex["item"]],
        "genres": ex["genres"],
        "tags": ex["tags"],
        "age": ex["age"] if bare else [ex["age"]],
        "ctx": ex["ctx"],
    }
    if ex["item_w"] is not None:
        row["item_w"] = ex["item_w"] if bare else [ex["item_w"]]
    if ex["genres_w"] is not None:
        row["genres_w"] = ex["genres_w"]
    return row


def _columns_json(examples: list[dict[str, Any]]) -> dict[str, Any]:
    cols: dict[str, Any] = {
        name: [e[name] for e in examples] for name in ("user", "item", "genres", "tags", "age")
    }
    cols["ctx"] = [e["ctx"] for e in examples]
    if any(e["item_w"] is not None for e in examples):
        cols["item_w"] = [1.0 if e["item_w"] is None else e["item_w"] for e in examples]
    if any(e["genres_w"] is not None for e in examples):
        cols["genres_w"] = [
            [1.0] * len(e["genres"]) if e["genres_w"] is None else e["genres_w"] for e in examples
        ]
    return cols


def _tf_example(ex: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
    """The example as a tf.train.Example built by TensorFlow itself."""

    def ints(v: list[int]) -> Any:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=v))

    def floats(v: list[float]) -> Any:
        return tf.train.Feature(float_list=tf.train.FloatList(value=v))

    feature = {
        "user": ints([ex["user"]]),
        "item": ints([ex["item"]]),
        "genres": ints(ex["genres"]),
        "tags": ints(ex["tags"]),
        "age": floats([ex["age"]]),
        "ctx": floats(ex["ctx"]),
        "label": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"ignored: not a model feature"])),
    }
    if ex["item_w"] is not None:
        feature["item_w"] = floats([ex["item_w"]])
    if ex["genres_w"] is not None:
        feature["genres_w"] = floats(ex["genres_w"])
    feature.update(extra or {})
    return tf.train.Example(features=tf.train.Features(feature=feature))


def _classify_json(ex: dict[str, Any]) -> dict[str, Any]:
    """The example as a :classify body item: floats stay JSON floats, ids JSON integers (TF's kind inference)."""
    row = _row_json(ex, bare=False)
    for key in ("item_w", "genres_w", "age", "ctx"):
        if key in row:
            row[key] = [float(v) for v in row[key]]
    return row


def _json_round_trip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _expected(examples: list[dict[str, Any]]) -> FeatureBatch:
    from gateway.features import SparseInput

    def sparse(key: str, wkey: str | None, multi: bool) -> SparseInput:
        per = [e[key] if multi else [e[key]] for e in examples]
        splits = np.concatenate([[0], np.cumsum([len(p) for p in per])]).astype(np.int64)
        ids = np.array([i for p in per for i in p], dtype=np.int64)
        weights = None
        if wkey and any(e[wkey] is not None for e in examples):
            w: list[float] = []
            for e, p in zip(examples, per, strict=True):
                got = e[wkey]
                w += [1.0] * len(p) if got is None else (got if multi else [got])
            weights = np.array(w, dtype=np.float32)
        return SparseInput(ids=ids, row_splits=splits, weights=weights)

    return FeatureBatch(
        size=len(examples),
        sparse={
            "user": sparse("user", None, False),
            "item": sparse("item", "item_w", False),
            "genres": sparse("genres", "genres_w", True),
            "tags": sparse("tags", None, True),
        },
        dense={
            "age": np.array([[e["age"]] for e in examples], dtype=np.float32).reshape(-1, 1),
            "ctx": np.array([e["ctx"] for e in examples], dtype=np.float32).reshape(-1, 2),
        },
    )


def assert_batches_equal(got: FeatureBatch, want: FeatureBatch) -> None:
    assert got.size == want.size
    assert set(got.sparse) == set(want.sparse)
    for name, w in want.sparse.items():
        g = got.sparse[name]
        assert g.ids.dtype == np.int64 and g.row_splits.dtype == np.int64, name
        np.testing.assert_array_equal(g.ids, w.ids, err_msg=name)
        np.testing.assert_array_equal(g.row_splits, w.row_splits, err_msg=name)
        if w.weights is None:
            assert g.weights is None, name
        else:
            assert g.weights is not None and g.weights.dtype == np.float32, name
            np.testing.assert_array_equal(g.weights, w.weights, err_msg=name)
    assert set(got.dense) == set(want.dense)
    for name, w in want.dense.items():
        assert got.dense[name].dtype == np.float32 and got.dense[name].shape == w.shape, name
        np.testing.assert_array_equal(got.dense[name], w, err_msg=name)


# -- every form, same batch -------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples=_EXAMPLES, bare=st.booleans())
def test_every_request_form_gives_the_same_batch(examples: list[dict[str, Any]], bare: bool) -> None:
    want = _expected(examples)

    rows = _json_round_trip([_row_json(e, bare) for e in examples])
    assert_batches_equal(batch_from_instances(rows, MANIFEST), want)

    assert_batches_equal(batch_from_columns(_json_round_trip(_columns_json(examples)), MANIFEST), want)

    serialized = [_tf_example(e).SerializeToString() for e in examples]
    b64_rows = [{"b64": base64.b64encode(s).decode()} for s in serialized]
    assert_batches_equal(batch_from_instances(b64_rows, MANIFEST), want)

    inp = tfs_pb2.Input()
    for s in serialized:
        inp.example_list.examples.add().ParseFromString(s)
    assert_batches_equal(batch_from_input(inp, MANIFEST), want)

    body = _json_round_trip({"examples": [_classify_json(e) for e in examples]})
    assert_batches_equal(batch_from_input(input_from_json(body, "regress"), MANIFEST), want)


@settings(max_examples=20, deadline=None)
@given(examples=_EXAMPLES, ctx=st.lists(st.floats(-10, 10, width=32), min_size=2, max_size=2), age=_DENSE)
def test_context_features_apply_to_every_example(
    examples: list[dict[str, Any]], ctx: list[float], age: float
) -> None:
    for e in examples:
        e["ctx"], e["age"] = ctx, age
    want = _expected(examples)
    items = []
    for e in examples:
        item = _classify_json(e)
        del item["ctx"], item["age"]
        items.append(item)
    body = _json_round_trip(
        {"context": {"ctx": [float(v) for v in ctx], "age": float(age)}, "examples": items}
    )
    inp = input_from_json(body, "classify")
    assert inp.WhichOneof("kind") == "example_list_with_context"
    assert_batches_equal(batch_from_input(inp, MANIFEST), want)


def test_mixed_row_forms_and_int64_dense_in_examples() -> None:
    ex = {
        "user": 1,
        "item": 2,
        "item_w": None,
        "genres": [3, 4],
        "genres_w": [0.5, 2.0],
        "tags": [],
        "age": 7.0,
        "ctx": [1.0, 2.0],
    }
    int_dense = {
        "age": tf.train.Feature(int64_list=tf.train.Int64List(value=[7])),
        "ctx": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2])),
    }
    rows = [
        _row_json(ex, bare=True),
        {"b64": base64.b64encode(_tf_example(ex, int_dense).SerializeToString()).decode()},
    ]
    assert_batches_equal(batch_from_instances(rows, MANIFEST), _expected([ex, ex]))
    # classify JSON with integer-valued dense features gives int64_list features, accepted as floats
    body = {
        "examples": [
            {
                "user": 1,
                "item": 2,
                "genres": [3, 4],
                "genres_w": [0.5, 2.0],
                "tags": [],
                "age": 7,
                "ctx": [1, 2],
            }
        ]
    }
    assert_batches_equal(batch_from_input(input_from_json(body, "classify"), MANIFEST), _expected([ex]))


def test_weights_may_be_integers_in_json_and_missing_weights_are_ones() -> None:
    rows = [
        {
            "user": 1,
            "item": 2,
            "item_w": 3,
            "genres": [3, 4],
            "genres_w": [1, 0.5],
            "tags": [5],
            "age": 1,
            "ctx": [0, 1],
        },
        {"user": 1, "item": 2, "genres": [3], "tags": [], "age": 1, "ctx": [0, 1]},
    ]
    b = batch_from_instances(rows, MANIFEST)
    np.testing.assert_array_equal(b.sparse["item"].weights, [3, 1])
    np.testing.assert_array_equal(b.sparse["genres"].weights, [1, 0.5, 1])
    assert b.sparse["tags"].weights is None
    np.testing.assert_array_equal(b.sparse["tags"].row_splits, [0, 1, 1])


def test_dense_values_beyond_float32_become_infinite_like_tf_serving() -> None:
    b = batch_from_instances([_with(ctx=[1e39, -1e39], age=10**30)], MANIFEST)
    np.testing.assert_array_equal(b.dense["ctx"], [[np.inf, -np.inf]])
    np.testing.assert_array_equal(b.dense["age"], [[np.float32(1e30)]])


def test_columnar_batch_may_be_empty() -> None:
    cols = {name: [] for name in ("user", "item", "genres", "tags", "age", "ctx")}
    b = batch_from_columns(cols, MANIFEST)
    assert b.size == 0
    assert b.dense["ctx"].shape == (0, 2)
    np.testing.assert_array_equal(b.sparse["genres"].row_splits, [0])


# -- errors -----------------------------------------------------------------------------------------------------------

GOOD = {
    "user": 1,
    "item": 2,
    "genres": [3, 4],
    "genres_w": [0.5, 1.0],
    "tags": [5],
    "age": 1.5,
    "ctx": [0.1, 0.2],
}


def _with(**changes: Any) -> dict[str, Any]:
    row = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is _DROP:
            del row[key]
        else:
            row[key] = value
    return row


_DROP = object()
_NAMES = (
    "the model takes sparse features user, item, genres, tags; dense features age, ctx; optional weights "
    "item_w, genres_w"
)

ROW_ERRORS: list[tuple[dict[str, Any], str]] = [
    (_with(userr=1), f"feature 'userr' at example 1: unknown feature; {_NAMES}"),
    (_with(user=_DROP), f"feature 'user' at example 1: missing; {_NAMES}"),
    (_with(tags=_DROP), f"feature 'tags' at example 1: missing; {_NAMES}"),
    (_with(ctx=_DROP), f"feature 'ctx' at example 1: missing; {_NAMES}"),
    (
        _with(user=True),
        "feature 'user' at example 1: expected one int64 id (an integer or a one-element list), got true",
    ),
    (
        _with(user=1.0),
        "feature 'user' at example 1: expected one int64 id (an integer or a one-element list), got 1.0",
    ),
    (
        _with(user="abc"),
        "feature 'user' at example 1: expected one int64 id (an integer or a one-element list), got \"abc\"",
    ),
    (
        _with(user=[1, 2]),
        "feature 'user' at example 1: expected one int64 id (an integer or a one-element list), got [1, 2]",
    ),
    (
        _with(user=[]),
        "feature 'user' at example 1: expected one int64 id (an integer or a one-element list), got []",
    ),
    (
        _with(user=None),
        "feature 'user' at example 1: expected one int64 id (an integer or a one-element list), got null",
    ),
    (_with(user=2**63), "feature 'user' at example 1: id 9223372036854775808 is outside int64"),
    (_with(user=[-(2**63) - 1]), "feature 'user' at example 1: id -9223372036854775809 is outside int64"),
    (_with(genres="abc"), "feature 'genres' at example 1: expected a list of int64 ids, got \"abc\""),
    (_with(genres=3), "feature 'genres' at example 1: expected a list of int64 ids, got 3"),
    (
        _with(genres=[3, "abc"]),
        "feature 'genres' at example 1: expected a list of int64 ids, got \"abc\" at position 1",
    ),
    (
        _with(genres=[3, 1.0]),
        "feature 'genres' at example 1: expected a list of int64 ids, got 1.0 at position 1",
    ),
    (
        _with(genres=[False]),
        "feature 'genres' at example 1: expected a list of int64 ids, got false at position 0",
    ),
    (
        _with(genres=[[3]]),
        "feature 'genres' at example 1: expected a list of int64 ids, got [3] at position 0",
    ),
    (
        _with(genres=[2**64]),
        "feature 'genres' at example 1: id 18446744073709551616 at position 0 is outside int64",
    ),
    (
        _with(genres=[1, 2, 3, 4, 5, 6], genres_w=_DROP),
        "feature 'genres' at example 1: 6 ids, more than max_ids 5",
    ),
    (
        _with(genres_w=[1.0]),
        "feature 'genres_w' at example 1: expected 2 weights (one per id of 'genres'), got 1",
    ),
    (
        _with(genres_w=[1.0, 1.0, 1.0]),
        "feature 'genres_w' at example 1: expected 2 weights (one per id of 'genres'), got 3",
    ),
    (
        _with(genres_w=0.5),
        "feature 'genres_w' at example 1: expected a list of weights (one number per id of 'genres'), got 0.5",
    ),
    (
        _with(genres_w=[1.0, True]),
        "feature 'genres_w' at example 1: expected a list of weights (one number per id of 'genres'), got true at position 1",
    ),
    (
        _with(genres_w=[1.0, "x"]),
        "feature 'genres_w' at example 1: expected a list of weights (one number per id of 'genres'), got \"x\" at position 1",
    ),
    (
        _with(genres_w=[1.0, float("nan")]),
        "feature 'genres_w' at example 1: weights must be finite float32 values, got NaN at position 1",
    ),
    (
        _with(genres_w=[float("-inf"), 1.0]),
        "feature 'genres_w' at example 1: weights must be finite float32 values, got -Infinity at position 0",
    ),
    (
        _with(genres_w=[1e39, 1.0]),
        "feature 'genres_w' at example 1: weights must be finite float32 values, got Infinity at position 0",
    ),
    (
        _with(item_w="x"),
        "feature 'item_w' at example 1: expected a weight for 'item' (a number or a one-element list), got \"x\"",
    ),
    (
        _with(item_w=[1.0, 2.0]),
        "feature 'item_w' at example 1: expected 1 weights (one per id of 'item'), got 2",
    ),
    (_with(ctx=[0.1]), "feature 'ctx' at example 1: expected 2 numbers, got 1"),
    (_with(ctx=[0.1, 0.2, 0.3]), "feature 'ctx' at example 1: expected 2 numbers, got 3"),
    (_with(ctx=0.1), "feature 'ctx' at example 1: expected a list of 2 numbers, got 0.1"),
    (
        _with(ctx=[0.1, "x"]),
        "feature 'ctx' at example 1: expected a list of 2 numbers, got \"x\" at position 1",
    ),
    (
        _with(ctx=[0.1, None]),
        "feature 'ctx' at example 1: expected a list of 2 numbers, got null at position 1",
    ),
    (
        _with(ctx=[True, 0.1]),
        "feature 'ctx' at example 1: expected a list of 2 numbers, got true at position 0",
    ),
    (
        _with(ctx=[[0.1], [0.2]]),
        "feature 'ctx' at example 1: expected a list of 2 numbers, got [0.1] at position 0",
    ),
    (_with(age="x"), "feature 'age' at example 1: expected a number (or a list of 1 number), got \"x\""),
    (_with(age=[1.0, 2.0]), "feature 'age' at example 1: expected 1 numbers, got 2"),
    (_with(age=10**400), "feature 'age' at example 1: a value is outside the float range"),
    (_with(ctx=[0.5, -(10**400)]), "feature 'ctx' at example 1: a value is outside the float range"),
    (_with(genres_w=[0.5, 10**400]), "feature 'genres_w' at example 1: a value is outside the float range"),
]


@pytest.mark.parametrize(("bad", "message"), ROW_ERRORS)
def test_row_errors_name_feature_and_example(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        batch_from_instances([GOOD, bad], MANIFEST)
    assert info.value.message == message
    assert info.value.http_status == 400


def _b64(example: Any) -> dict[str, str]:
    return {"b64": base64.b64encode(example.SerializeToString()).decode()}


def _tf_good(**features: Any) -> Any:
    ex = {
        "user": 1,
        "item": 2,
        "item_w": None,
        "genres": [3, 4],
        "genres_w": None,
        "tags": [5],
        "age": 1.5,
        "ctx": [0.1, 0.2],
    }
    example = _tf_example(ex)
    for name, feature in features.items():
        if feature is _DROP:
            del example.features.feature[name]
        else:
            example.features.feature[name].CopyFrom(feature)
    return example


def _ints(*v: int) -> Any:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))


def _floats(*v: float) -> Any:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(v)))


def _bytes(*v: bytes) -> Any:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))


EXAMPLE_ERRORS: list[tuple[Any, str]] = [
    (
        _tf_good(user=_floats(1.0)),
        "feature 'user' at example 1: expected an int64_list of ids, got a float_list",
    ),
    (
        _tf_good(genres=_bytes(b"3")),
        "feature 'genres' at example 1: expected an int64_list of ids, got a bytes_list",
    ),
    (_tf_good(user=_ints(1, 2)), "feature 'user' at example 1: expected exactly one id, got 2"),
    (_tf_good(user=tf.train.Feature()), "feature 'user' at example 1: expected exactly one id, got 0"),
    (_tf_good(genres=_ints(1, 2, 3, 4, 5, 6)), "feature 'genres' at example 1: 6 ids, more than max_ids 5"),
    (
        _tf_good(ctx=_bytes(b"x")),
        "feature 'ctx' at example 1: expected a float_list (or int64_list) of values, got a bytes_list",
    ),
    (_tf_good(ctx=_floats(1.0, 2.0, 3.0)), "feature 'ctx' at example 1: expected 2 values, got 3"),
    (_tf_good(age=tf.train.Feature()), "feature 'age' at example 1: expected 1 values, got 0"),
    (
        _tf_good(genres_w=_floats(1.0)),
        "feature 'genres_w' at example 1: expected 2 weights (one per id of 'genres'), got 1",
    ),
    (
        _tf_good(genres_w=_floats(1.0, float("nan"))),
        "feature 'genres_w' at example 1: weights must be finite float32 values, got NaN at position 1",
    ),
    (
        _tf_good(item_w=_bytes(b"1")),
        "feature 'item_w' at example 1: expected a float_list (or int64_list) of values, got a bytes_list",
    ),
    (_tf_good(tags=_DROP), f"feature 'tags' at example 1: missing from the tf.Example; {_NAMES}"),
    (_tf_good(age=_DROP), f"feature 'age' at example 1: missing from the tf.Example; {_NAMES}"),
]


@pytest.mark.parametrize(("bad", "message"), EXAMPLE_ERRORS)
def test_example_errors_name_feature_and_example(bad: Any, message: str) -> None:
    good = _tf_good()
    with pytest.raises(InvalidArgument) as info:
        batch_from_instances([_b64(good), _b64(bad)], MANIFEST)
    assert info.value.message == message
    inp = tfs_pb2.Input()
    for ex in (good, bad):
        inp.example_list.examples.add().ParseFromString(ex.SerializeToString())
    with pytest.raises(InvalidArgument) as info:
        batch_from_input(inp, MANIFEST)
    assert info.value.message == message


def test_context_and_example_may_not_both_hold_a_feature() -> None:
    example = {"user": 1, "item": 2, "genres": [3], "tags": [], "age": 2.0, "ctx": [0.5, 1.5]}
    inp = input_from_json({"context": {"age": 1.0}, "examples": [example]}, "classify")
    with pytest.raises(
        InvalidArgument, match=r"^feature 'age' at example 0: present in both the context and the example$"
    ):
        batch_from_input(inp, MANIFEST)


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ([GOOD, {"b64": "QQ="}], "example 1: Unable to base64 decode"),
        ([GOOD, {"b64": "QU-_"}], "example 1: Unable to base64 decode"),
        (
            [GOOD, {"b64": base64.b64encode(b"\x0a\x05ab").decode()}],
            "example 1: the bytes do not parse as a serialized tf.Example",
        ),
        ([GOOD, 5], 'example 1: expected an object of features or {"b64": ...}, got 5'),
        ([GOOD, [1]], 'example 1: expected an object of features or {"b64": ...}, got [1]'),
        ([], "'instances' must hold at least one example"),
        ({"user": 1}, "'instances' must be a list of examples, got {\"user\": 1}"),
    ],
)
def test_instance_level_errors(instances: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        batch_from_instances(instances, MANIFEST)
    assert info.value.message == message


GOOD_COLUMNS = {
    "user": [1, 2],
    "item": [3, 4],
    "genres": [[1], []],
    "tags": [[], [2, 3]],
    "age": [1.0, 2.0],
    "ctx": [[0.1, 0.2], [0.3, 0.4]],
}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"ctx": [[0.1, 0.2], [0.3]]},
            "feature 'ctx' at example 1: expected 2 numbers, got 1",
        ),  # ragged dense
        ({"ctx": [[0.1, 0.2], 0.3]}, "feature 'ctx' at example 1: expected a list of 2 numbers, got 0.3"),
        (
            {"item": [3]},
            "feature 'item' has 1 examples but feature 'user' has 2; every feature needs one value per example",
        ),
        (
            {"genres_w": [[1.0], [], []]},
            "feature 'genres_w' has 3 examples but feature 'user' has 2; every feature needs one value per example",
        ),
        ({"user": 5}, "feature 'user': expected a list with one value per example, got 5"),
        (
            {"user": [1, "x"]},
            "feature 'user' at example 1: expected one int64 id (an integer or a one-element list), got \"x\"",
        ),
        ({"genres": [[1], 2]}, "feature 'genres' at example 1: expected a list of int64 ids, got 2"),
        (
            {"genres_w": [[1.0], [1.0]]},
            "feature 'genres_w' at example 1: expected 0 weights (one per id of 'genres'), got 1",
        ),
        ({"age": _DROP}, f"feature 'age': missing; {_NAMES}"),
        ({"nope": [1, 2]}, f"feature 'nope': unknown feature; {_NAMES}"),
    ],
)
def test_columnar_errors(changes: dict[str, Any], message: str) -> None:
    cols = copy.deepcopy(GOOD_COLUMNS)
    for key, value in changes.items():
        if value is _DROP:
            del cols[key]
        else:
            cols[key] = value
    with pytest.raises(InvalidArgument) as info:
        batch_from_columns(cols, MANIFEST)
    assert info.value.message == message


def test_columnar_inputs_must_be_an_object() -> None:
    with pytest.raises(InvalidArgument, match=r"^'inputs' must be an object mapping each feature"):
        batch_from_columns([[1, 2]], MANIFEST)


def test_empty_input_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match="Input is empty"):
        batch_from_input(tfs_pb2.Input(), MANIFEST)
    inp = tfs_pb2.Input()
    inp.example_list.SetInParent()
    with pytest.raises(InvalidArgument, match="Input holds no examples"):
        batch_from_input(inp, MANIFEST)


# -- client signature -------------------------------------------------------------------------------------------------


def test_client_signature() -> None:
    out = tfs_pb2.TensorInfo(name="StatefulPartitionedCall:0", dtype=tfs_pb2.DT_FLOAT)
    out.tensor_shape.dim.add(size=-1)
    out.tensor_shape.dim.add(size=1)
    sig = client_signature(MANIFEST, {"score": out})
    assert sig.method_name == "tensorflow/serving/predict"

    def shape(info: tfs_pb2.TensorInfo) -> list[int]:
        return [d.size for d in info.tensor_shape.dim]

    got = {name: (info.dtype, shape(info), info.name) for name, info in sig.inputs.items()}
    assert got == {
        "user": (tfs_pb2.DT_INT64, [-1], "user:0"),
        "item": (tfs_pb2.DT_INT64, [-1], "item:0"),
        "item_w": (tfs_pb2.DT_FLOAT, [-1], "item_w:0"),
        "genres": (tfs_pb2.DT_INT64, [-1, -1], "genres:0"),
        "genres_w": (tfs_pb2.DT_FLOAT, [-1, -1], "genres_w:0"),
        "tags": (tfs_pb2.DT_INT64, [-1, -1], "tags:0"),
        "age": (tfs_pb2.DT_FLOAT, [-1, 1], "age:0"),
        "ctx": (tfs_pb2.DT_FLOAT, [-1, 2], "ctx:0"),
    }
    assert dict(sig.outputs) == {"score": out}
    # wire-compatible with TensorFlow's SignatureDef
    from tensorflow.core.protobuf import meta_graph_pb2

    theirs = meta_graph_pb2.SignatureDef.FromString(sig.SerializeToString())
    assert theirs.inputs["genres"].dtype == tf.int64.as_datatype_enum
    assert [d.size for d in theirs.inputs["ctx"].tensor_shape.dim] == [-1, 2]


# -- no TensorFlow in the gateway -------------------------------------------------------------------------------------


def test_gateway_modules_do_not_import_tensorflow() -> None:
    code = (
        "import sys\n"
        "import gateway.features, gateway.embedding, gateway.codec.example\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tensorflow_serving'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
