"""Native (``embedgate_native`` via ``gateway.native``) vs the Python reference for the embedding hot path.

* The lookup plan: ``gateway.embedding.plan_lookups`` (native when on) against ``plan_lookups_reference`` (numpy) on
  generated manifests (1-4 shards, 1-3 tables, single and multi features on shared tables, every combiner, weights,
  ``mask_zero``, integer-lookup and hashing layers, both entry input modes) and batches parsed from REST rows with
  padding, negative and int64-extreme ids: the same ids per (shard, table), the same row per id, and so the same entry
  request bytes (``unique_rows``: rows + indices; ``pooled``: the pooled rows) for the same PS answers.
* Every request form (REST rows and columns, tf.Example, gRPC tensors) with a padded ``mask_zero`` history: the
  native entry request equals the reference's and the mean skips the padding (issue 17 item 0).
* The hot-row cache's id -> slot index: the native ``SlotIndex`` against a ``dict`` under random operations, and a
  ``RowCache`` built on each answering the same reads through the same fills, upserts, deletes and evictions.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.cache import RowCache
from gateway.embedding import (
    LookupPlan,
    _combine,
    entry_inputs,
    plan_lookups,
    plan_lookups_reference,
    pool,
)
from gateway.features import (
    FeatureBatch,
    SparseInput,
    batch_from_columns,
    batch_from_input,
    batch_from_instances,
)
from gateway.grpc_front.features import batch_from_tensors
from gateway.lookup_mapping import HashInput, LookupKind, LookupMapping, attach_lookups, detach_lookups
from schemas.manifest import Combiner, FeatureKind, Manifest, SparseFeatureSpec
from schemas.proto import tfs_pb2
from schemas.tensors import from_ndarray
from tests.support.native import native_mode

pytestmark = pytest.mark.skipif(not native.available(), reason="embedgate_native is not built (make install)")

_I64 = st.integers(-(2**63), 2**63 - 1)
_WEIGHT = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5]), st.floats(-1e3, 1e3, width=32))
_ID = st.one_of(st.integers(0, 12), st.integers(-5, 5), _I64, st.sampled_from([2**62, 2**63 - 1, -(2**63)]))


@st.composite
def _manifest(draw: st.DrawFn) -> Manifest:
    num_tables = draw(st.integers(1, 3))
    tables = [{"name": f"t{k}", "dim": draw(st.integers(1, 3))} for k in range(num_tables)]
    sparse: list[dict[str, Any]] = []
    for k in range(draw(st.integers(1, 5))):
        f: dict[str, Any] = {"name": f"f{k}", "table": f"t{draw(st.integers(0, num_tables - 1))}"}
        if draw(st.booleans()):
            f["kind"] = "multi"
            f["combiner"] = draw(st.sampled_from(["sum", "mean", "sqrtn"]))
            f["mask_zero"] = draw(st.booleans())
            f["max_ids"] = 12
        if draw(st.booleans()):
            f["weights"] = f"f{k}_w"
        sparse.append(f)
    mode = draw(st.sampled_from(["pooled", "unique_rows"]))
    entry: dict[str, Any] = {"outputs": [{"name": "y", "shape": [1]}], "input_mode": mode}
    if mode == "unique_rows":
        entry["row_dtype"] = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    return Manifest.model_validate(
        {
            "model_name": "m",
            "version": 1,
            "tables": tables,
            "sparse_features": sparse,
            "dense_features": [{"name": "d", "dim": 2}] if draw(st.booleans()) else [],
            "partition": {"num_shards": draw(st.integers(1, 4))},
            "entry": entry,
        }
    )


def _lookups(draw: Any, manifest: Manifest) -> dict[str, LookupMapping]:
    """Integer-lookup or integer-hashing layers on some features (strings reach the plan as int64 keys too)."""
    out: dict[str, LookupMapping] = {}
    for f in manifest.sparse_features:
        kind = draw(st.sampled_from(["none", "none", "integer", "hashing"]))
        if kind == "integer":
            vocab = np.unique(np.array(draw(st.lists(st.integers(1, 12), min_size=1, max_size=6)), np.int64))
            out[f.name] = LookupMapping(f.name, LookupKind.INTEGER, f"{f.name}_lookup", vocab)
        elif kind == "hashing":
            out[f.name] = LookupMapping(
                f.name,
                LookupKind.HASHING,
                f"{f.name}_hash",
                np.empty(0, np.int64),
                num_bins=draw(st.integers(2, 9)),
                hash_input=HashInput.INTEGER,
                mask_value=draw(st.sampled_from([None, 0])),
            )
    return out


def _instances(draw: Any, manifest: Manifest) -> list[dict[str, Any]]:
    size = draw(st.integers(1, 6))
    weighted = {f.name: draw(st.booleans()) for f in manifest.sparse_features if f.weights}
    out = []
    for _ in range(size):
        ex: dict[str, Any] = {}
        for f in manifest.sparse_features:
            ids: Any = draw(st.lists(_ID, max_size=12)) if f.kind.value == "multi" else draw(_ID)
            if f.mask_zero and draw(st.booleans()):
                ids = [*ids, *[0] * draw(st.integers(1, 4))][:12]  # padded the way Keras input is
            ex[f.name] = ids
            if f.weights and weighted[f.name]:
                n = len(ids) if isinstance(ids, list) else None
                ex[f.weights] = (
                    draw(st.lists(_WEIGHT, min_size=n, max_size=n)) if n is not None else draw(_WEIGHT)
                )
        for d in manifest.dense_features:
            ex[d.name] = [0.25, -1.0]
        out.append(ex)
    return out


def _shard_values(plan: LookupPlan, manifest: Manifest, seed: int) -> list[dict[str, np.ndarray]]:
    """PS answers that depend only on (table, id), as a PS's would."""
    dims = {t.name: t.dim for t in manifest.tables}
    out = []
    for shard in plan.shard_ids:
        answer = {}
        for table, ids in shard.items():
            col = np.arange(dims[table], dtype=np.float64)
            answer[table] = (np.sin(ids.astype(np.float64)[:, None] * 1e-3 + col + seed) * 3).astype(
                np.float32
            )
        out.append(answer)
    return out


def _same_plan(a: LookupPlan, b: LookupPlan) -> None:
    assert len(a.shard_ids) == len(b.shard_ids)
    for sa, sb in zip(a.shard_ids, b.shard_ids, strict=True):
        assert list(sa) == list(sb)
        for table in sa:
            assert sa[table].dtype == sb[table].dtype == np.int64
            np.testing.assert_array_equal(sa[table], sb[table])
    assert list(a._rows) == list(b._rows)
    for name, rows in a._rows.items():
        assert rows.tolist() == b._rows[name].tolist()


def _same_inputs(a: list[tuple[str, np.ndarray]], b: list[tuple[str, np.ndarray]]) -> None:
    assert [k for k, _ in a] == [k for k, _ in b]
    for (name, x), (_, y) in zip(a, b, strict=True):
        assert (name, x.dtype, x.shape) == (name, y.dtype, y.shape)
        assert x.tobytes() == y.tobytes(), name


def _both(batch: FeatureBatch, manifest: Manifest) -> tuple[LookupPlan, LookupPlan]:
    with native_mode("auto"):
        fast = plan_lookups(batch, manifest)
    return fast, plan_lookups_reference(batch, manifest)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_native_plan_and_entry_request_equal_the_reference(data: st.DataObject) -> None:
    manifest = data.draw(_manifest())
    mappings = _lookups(data.draw, manifest)
    attach_lookups(manifest, mappings)
    try:
        batch = batch_from_instances(_instances(data.draw, manifest), manifest)
    finally:
        detach_lookups(manifest)
    fast, ref = _both(batch, manifest)
    assert all(r.dtype == np.int32 for r in fast._rows.values())  # the native path ran
    _same_plan(fast, ref)
    values = _shard_values(ref, manifest, data.draw(st.integers(0, 3)))
    with native_mode("auto"):
        fast_inputs, pooled_fast = (
            entry_inputs(fast, values, batch, manifest),
            pool(fast, values, batch, manifest),
        )
    with native_mode("off"):
        ref_inputs, pooled_ref = (
            entry_inputs(ref, values, batch, manifest),
            pool(ref, values, batch, manifest),
        )
    _same_inputs(fast_inputs, ref_inputs)
    for name, rows in pooled_ref.items():
        assert rows.dtype == pooled_fast[name].dtype == np.float32
        assert rows.tobytes() == pooled_fast[name].tobytes(), name


_COMBINER = st.sampled_from([Combiner.SUM, Combiner.MEAN, Combiner.SQRTN])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=5),
    st.integers(1, 5),
    _COMBINER,
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_native_pooling_equals_the_reference_bit_for_bit(
    lengths: list[int], dim: int, combiner: Combiner, weighted: bool, single: bool, seed: int
) -> None:
    """Long segments too (numpy sums 8+ and 128+ values pairwise): every combiner, with and without weights."""
    rng = np.random.default_rng(seed)
    if single:
        lengths = [1] * len(lengths)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    nnz = int(splits[-1])
    table = (rng.standard_normal((max(1, nnz // 2), dim)) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
    table[0] = -0.0
    rows = rng.integers(0, table.shape[0], nnz).astype(np.int32)
    weights = None
    if weighted:
        weights = rng.choice([0.0, -0.0, 1.0, -2.5, 1e-3, 7.0], nnz).astype(np.float32)
    spec = SparseFeatureSpec(
        name="f", table="t", kind=FeatureKind.SINGLE if single else FeatureKind.MULTI, combiner=combiner
    )
    sparse = SparseInput(ids=rows.astype(np.int64), row_splits=splits, weights=weights)
    with native_mode("auto"):
        got = native.pool_feature(table, rows, None if single else splits, weights, combiner.value)
    assert got is not None
    want = _combine(table[rows], sparse, spec, len(lengths))
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


def test_native_off_runs_the_reference() -> None:
    manifest = Manifest.model_validate(_PADDED)
    batch = batch_from_instances([{"h": [3, 0], "u": 1}], manifest)
    with native_mode("off"):
        assert native.plan_lookups([batch.sparse["h"].ids], [0], 1, 1) is None
        assert isinstance(native.slot_index(), dict)
        assert (
            native.pool_feature(np.zeros((1, 1), np.float32), np.zeros(1, np.int32), None, None, "sum")
            is None
        )
        assert plan_lookups(batch, manifest)._rows["h"].dtype == np.intp


_PADDED: dict[str, Any] = {
    "model_name": "m",
    "version": 1,
    "tables": [{"name": "items", "dim": 2}, {"name": "users", "dim": 2}],
    "sparse_features": [
        {
            "name": "h",
            "table": "items",
            "kind": "multi",
            "combiner": "mean",
            "mask_zero": True,
            "max_ids": 10,
        },
        {"name": "u", "table": "users"},
    ],
    "partition": {"num_shards": 2},
    "entry": {"outputs": [{"name": "y", "shape": [1]}]},
}
_HISTORIES = [[5, 9, 13, 0, 0, 0, 0, 0, 0, 0], [0, 0], [7]]


def _example(history: list[int], user: int) -> tfs_pb2.Example:
    ex = tfs_pb2.Example()
    ex.features.feature["h"].int64_list.value.extend(history)
    ex.features.feature["u"].int64_list.value.append(user)
    return ex


def _every_form(manifest: Manifest) -> dict[str, FeatureBatch]:
    rows = [{"h": h, "u": k} for k, h in enumerate(_HISTORIES)]
    padded = np.array([[*h, *[-1] * (10 - len(h))] for h in _HISTORIES], np.int64)
    inp = tfs_pb2.Input()
    inp.example_list.examples.extend(_example(h, k) for k, h in enumerate(_HISTORIES))
    b64 = [
        {"b64": base64.b64encode(_example(h, k).SerializeToString()).decode()}
        for k, h in enumerate(_HISTORIES)
    ]
    return {
        "rest rows": batch_from_instances(rows, manifest),
        "rest columns": batch_from_columns({"h": _HISTORIES, "u": [0, 1, 2]}, manifest),
        "rest b64 examples": batch_from_instances(b64, manifest),
        "tf.Example": batch_from_input(inp, manifest),
        "grpc": batch_from_tensors(
            {"h": from_ndarray(padded), "u": from_ndarray(np.arange(3, dtype=np.int64))}, manifest
        ),
    }


@pytest.mark.parametrize("mode", ["pooled", "unique_rows"])
def test_padded_history_is_masked_on_every_form(mode: str) -> None:
    manifest = Manifest.model_validate({**_PADDED, "entry": {**_PADDED["entry"], "input_mode": mode}})
    for form, batch in _every_form(manifest).items():
        fast, ref = _both(batch, manifest)
        _same_plan(fast, ref)
        assert 0 not in np.concatenate([s["items"] for s in fast.shard_ids]).tolist(), form
        values = _shard_values(ref, manifest, 1)
        with native_mode("off"):
            ref_inputs = entry_inputs(ref, values, batch, manifest)
        _same_inputs(entry_inputs(fast, values, batch, manifest), ref_inputs)
        rows = {
            int(i): v
            for s, sv in zip(fast.shard_ids, values, strict=True)
            for i, v in zip(s["items"], sv["items"], strict=True)
        }
        for mode, plan in (("auto", fast), ("off", ref)):  # the native path and the reference, each checked
            with native_mode(mode):
                pooled = pool(plan, values, batch, manifest)["h"]
            mean = np.mean([rows[5], rows[9], rows[13]], axis=0)
            np.testing.assert_allclose(pooled[0], mean, rtol=1e-6, err_msg=f"{form} {mode}")
            assert pooled[1].tolist() == [0.0, 0.0], (form, mode)  # only padding: no ids, a zero row (Keras)
            np.testing.assert_array_equal(pooled[2], rows[7], err_msg=f"{form} {mode}")


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["set", "get", "pop", "contains", "slots"]), st.integers(-3, 40), st.integers(0, 99)
    ),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(_OPS, st.lists(_I64, max_size=5))
def test_slot_index_behaves_like_a_dict(ops: list[tuple[str, int, int]], extreme: list[int]) -> None:
    with native_mode("auto"):
        index = native.slot_index()
    assert not isinstance(index, dict)
    ref: dict[int, int] = {}
    for op, key, slot in [*ops, *(("set", k, 1) for k in extreme), *(("get", k, 0) for k in extreme)]:
        if op == "set":
            index[key] = slot
            ref[key] = slot
        elif op == "get":
            assert index.get(key) == ref.get(key)
            assert index.get(key, -1) == ref.get(key, -1)
        elif op == "pop":
            assert index.pop(key, None) == ref.pop(key, None)
        elif op == "contains":
            assert (key in index) == (key in ref)
        else:
            ids = np.array([key, key + 1, *ref], np.int64)
            assert index.slots(ids, -1).tolist() == [ref.get(int(i), -1) for i in ids]
        assert len(index) == len(ref)


_CACHE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["read", "fill", "upsert", "delete"]),
        st.sampled_from(["a", "b"]),
        st.lists(st.integers(-4, 30), max_size=8, unique=True),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(_CACHE_OPS)
def test_row_cache_answers_the_same_on_either_index(ops: list[tuple[str, str, list[int]]]) -> None:
    caches = []
    for mode in ("auto", "off"):
        with native_mode(mode):
            cache = RowCache("m", {"a": 2, "b": 3}, 8 * (4 * 3 + 320), settle_s=0.0, clock=lambda: 0.0)
        cache.set_serving(True)
        caches.append(cache)
    fast, ref = caches
    assert not isinstance(fast._slabs["a"].index, dict) and isinstance(ref._slabs["a"].index, dict)
    for op, table, keys in ops:
        ids = np.array(keys, np.int64)
        dim = fast.dims[table]
        values = (ids[:, None] * 10 + np.arange(dim)).astype(np.float32)
        got: list[Any] = []
        for cache in caches:
            if op == "read":
                masks, found, missed = cache.get_many([{table: ids}])
                got.append((masks[0][table].tolist(), found[0][table].tolist(), missed))
            elif op == "fill":
                got.append(cache.fill(cache.begin_read(), table, ids, values))
            elif op == "upsert":
                cache.apply_upsert(table, ids, values + 0.5)
            else:
                cache.apply_delete(table, ids)
        if got:
            assert got[0] == got[1]
        assert fast.lru_order() == ref.lru_order()
        assert (len(fast), fast.bytes) == (len(ref), ref.bytes)
