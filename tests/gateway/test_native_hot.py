"""The all-cached read path in one native call (``RowCache.cached_entry_request``, native/src/hot.rs) against the
general path it short-cuts, which is its reference: the lookup plan, ``RowCache.get_many`` and
``gateway.embedding.entry_request`` with the native path off (``schemas.wire.predict_request_for``).

On generated manifests (1-4 shards, shared tables, single and multi features, weights sent or not, ``mask_zero``,
dense features) and batches, two caches filled alike: when every row is cached both give the same request bytes,
the same LRU order and the same hit count; when a row is missing the native call answers None and changes nothing.
A gateway with the cache on serves a warm batch through it without calling a PS, and a cold one as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import native
from gateway.cache import CachedRowSource, RowCache, ShardRows
from gateway.core.requests import VersionSpec
from gateway.embedding import entry_request, plan_lookups
from gateway.features import batch_from_instances
from schemas.manifest import EntryInputMode, EntryRowDtype, Manifest
from schemas.proto import tfs_pb2
from tests.gateway.test_native_plan import _instances, _manifest, _shard_values
from tests.support.native import native_mode

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._module(), "cached_entry_request"),
    reason="embedgate_native is not built with the cached read path (make install)",
)

_SPEC = tfs_pb2.ModelSpec(name="m__entry", signature_name="serving_default")
_HEAD = tfs_pb2.PredictRequest(model_spec=_SPEC).SerializeToString()


def _unique_rows(manifest: Manifest, row_dtype: EntryRowDtype = EntryRowDtype.FLOAT32) -> Manifest:
    entry = manifest.entry.model_copy(
        update={"input_mode": EntryInputMode.UNIQUE_ROWS, "row_dtype": row_dtype}
    )
    return manifest.model_copy(update={"entry": entry})


def _one_table(
    sparse: list[dict[str, str]], num_shards: int, row_dtype: EntryRowDtype = EntryRowDtype.FLOAT32
) -> Manifest:
    """A unique_rows manifest of one table ``t`` of dim 2 read by ``sparse``."""
    doc = {
        "model_name": "m",
        "version": 1,
        "tables": [{"name": "t", "dim": 2}],
        "sparse_features": sparse,
        "partition": {"num_shards": num_shards},
        "entry": {"outputs": [{"name": "y", "shape": [1]}]},
    }
    return _unique_rows(Manifest.model_validate(doc), row_dtype)


def _cache(manifest: Manifest) -> RowCache:
    with native_mode("auto"):
        cache = RowCache(
            "m", {t.name: t.dim for t in manifest.tables}, 1 << 24, settle_s=0.0, clock=lambda: 0.0
        )
    cache.set_serving(True)
    return cache


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_the_cached_request_equals_the_general_paths(data: st.DataObject) -> None:
    row_dtype = data.draw(st.sampled_from([EntryRowDtype.FLOAT32, EntryRowDtype.BFLOAT16]))
    manifest = _unique_rows(data.draw(_manifest()), row_dtype)
    batch = batch_from_instances(_instances(data.draw, manifest), manifest)
    plan = plan_lookups(batch, manifest)
    values = _shard_values(plan, manifest, data.draw(st.integers(0, 3)))
    if data.draw(
        st.booleans()
    ):  # values bfloat16 rounds at a tie, to infinity, and NaN (tables may allow NaN)
        specials = np.array([1.00390625, 1.01171875, 3.4e38, np.nan, -np.nan, -0.0], np.float32)
        for shard in values:
            for table, rows in shard.items():
                shard[table] = specials[np.arange(rows.size) % specials.size].reshape(rows.shape)
    fast, ref = _cache(manifest), _cache(manifest)
    # other rows first (so slots are not the plan's order), then the batch's rows in a drawn order, some left out
    extra = np.array(data.draw(st.lists(st.integers(100, 200), max_size=6, unique=True)), np.int64)
    keys = [(s, t) for s, shard in enumerate(plan.shard_ids) for t in shard if shard[t].size]
    order = data.draw(st.permutations(keys))
    leave_out = data.draw(st.booleans()) and bool(keys)
    for cache in (fast, ref):
        for t in manifest.tables:
            cache.fill(cache.begin_read(), t.name, extra, np.ones((extra.size, t.dim), np.float32))
        for k, (s, t) in enumerate(order):
            ids = plan.shard_ids[s][t]
            if leave_out and k == 0:
                ids, vals = ids[1:], values[s][t][1:]
            else:
                vals = values[s][t]
            cache.fill(cache.begin_read(), t, ids, vals)
    before = fast.lru_order()
    wire = fast.cached_entry_request(_HEAD, batch, manifest)
    if leave_out:
        assert wire is None
        assert fast.lru_order() == before and fast.hits == 0
        return
    _, found, missed = ref.get_many(plan.shard_ids)
    assert missed == 0
    with native_mode("off"):
        want = entry_request(_SPEC, plan, found, batch, manifest)
    assert wire == want
    assert fast.lru_order() == ref.lru_order()
    assert (fast.hits, fast.misses, fast._tick) == (ref.hits, ref.misses, ref._tick)


def test_a_float16_entry_is_left_to_the_general_path() -> None:
    manifest = _one_table([{"name": "f", "table": "t"}], 1, EntryRowDtype.FLOAT16)
    batch = batch_from_instances([{"f": 3}], manifest)
    cache = _cache(manifest)
    cache.fill(cache.begin_read(), "t", np.array([3], np.int64), np.ones((1, 2), np.float32))
    assert cache.cached_entry_request(_HEAD, batch, manifest) is None and cache.hits == 0


def test_the_native_path_off_or_another_manifest_declines() -> None:
    """Native off, or a manifest whose tables are not the cache's: None, nothing counted."""
    manifest = _one_table([{"name": "f", "table": "t"}], 2)
    batch = batch_from_instances([{"f": 3}, {"f": 4}], manifest)
    cache = _cache(manifest)
    cache.fill(cache.begin_read(), "t", np.array([3, 4], np.int64), np.ones((2, 2), np.float32))
    with native_mode("off"):
        assert cache.cached_entry_request(_HEAD, batch, manifest) is None
    wider = manifest.model_copy(update={"tables": [manifest.tables[0].model_copy(update={"dim": 3})]})
    assert cache.cached_entry_request(_HEAD, batch, wider) is None
    assert cache.hits == 0
    first = cache.cached_entry_request(_HEAD, batch, manifest)
    assert first is not None and cache.hits == 2
    # each manifest keeps its own layout: asked in turn, each gets its own answer again
    assert cache.cached_entry_request(_HEAD, batch, wider) is None and cache.hits == 2
    assert cache.cached_entry_request(_HEAD, batch, manifest) == first and cache.hits == 4


class _PS:
    """Row of id i in table t = [i, i]; counts its lookups."""

    def __init__(self) -> None:
        self.calls = 0

    async def lookup(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]], version: VersionSpec, deadline: float
    ) -> ShardRows:
        self.calls += 1
        values = [
            {t: np.repeat(ids.astype(np.float32)[:, None], 2, axis=1) for t, ids in shard.items()}
            for shard in shard_ids
        ]
        return ShardRows(values, ("1",) * len(shard_ids))


def test_a_cached_row_source_answers_a_warm_batch_alone_and_a_cold_one_not() -> None:
    manifest = _one_table([{"name": "f", "table": "t"}, {"name": "g", "table": "t", "kind": "multi"}], 2)
    batch = batch_from_instances([{"f": 3, "g": [5, 6]}, {"f": 4, "g": []}], manifest)
    plan = plan_lookups(batch, manifest)
    ps = _PS()
    source = CachedRowSource(ps, _cache(manifest))
    assert source.cached_entry_request(_HEAD, batch, manifest, VersionSpec()) is None  # cold
    answer = asyncio.run(source.lookup(plan.shard_ids, VersionSpec(), 0.0))
    assert ps.calls == 1
    wire = source.cached_entry_request(_HEAD, batch, manifest, VersionSpec())
    with native_mode("off"):
        assert wire == entry_request(_SPEC, plan, answer.values, batch, manifest)
    assert ps.calls == 1
    source.cache.set_serving(False, "stream down")
    assert source.cached_entry_request(_HEAD, batch, manifest, VersionSpec()) is None
    source.cache.set_serving(True)
    assert source.cached_entry_request(_HEAD, batch, manifest, VersionSpec(label="canary")) is None
