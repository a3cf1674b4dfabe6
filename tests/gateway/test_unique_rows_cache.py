"""The unique_rows entry request with the hot-row cache on and off: a padded mask_zero history and a one-user
ranking batch parsed by the gateway, rows from a cold then warm gateway.cache.CachedRowSource and straight from the
PS: the same tensors every time, each distinct row once, padding never looked up, and pooled in numpy to what the
pooled entry would be given."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from gateway.cache import CachedRowSource, RowCache, ShardRows
from gateway.core.requests import VersionSpec
from gateway.embedding import entry_inputs, plan_lookups, pool
from gateway.features import batch_from_instances
from schemas.manifest import Manifest, entry_index_input, entry_rows_input, entry_splits_input

DIM = 3


def _manifest(mode: str) -> Manifest:
    return Manifest.model_validate(
        {
            "model_name": "m",
            "version": 1,
            "tables": [{"name": "t", "dim": DIM}],
            "sparse_features": [
                {"name": "user", "table": "t"},
                {"name": "item", "table": "t"},
                {"name": "hist", "table": "t", "kind": "multi", "combiner": "mean", "mask_zero": True},
            ],
            "partition": {"num_shards": 1},
            "entry": {"outputs": [{"name": "y", "shape": [1]}], "input_mode": mode},
        }
    )


class _PS:
    """Row of id i = [i, 2i, 3i]; records every id it was asked."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def lookup(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]], version: VersionSpec, deadline: float
    ) -> ShardRows:
        ids = shard_ids[0]["t"]
        self.asked += ids.tolist()
        values = ids.astype(np.float32)[:, None] * np.array([1, 2, 3], np.float32)
        return ShardRows([{"t": values}], ("1",))


def _instances() -> list[dict[str, object]]:
    """One user (id 7, history [5, 9, 13] padded with 0 to 10) ranking 6 candidates (two repeated)."""
    return [
        {"user": 7, "item": item, "hist": [5, 9, 13, 0, 0, 0, 0, 0, 0, 0]}
        for item in (21, 22, 21, 23, 24, 22)
    ]


def test_cache_on_and_off_give_the_same_unique_rows_request() -> None:
    unique, pooled = _manifest("unique_rows"), _manifest("pooled")
    batch = batch_from_instances(_instances(), unique)
    plan = plan_lookups(batch, unique)
    ps = _PS()
    cache = RowCache("m", {"t": DIM}, 1 << 20, settle_s=0.0)
    cache.set_serving(True)
    cached = CachedRowSource(ps, cache)
    answers = [
        asyncio.run(source.lookup(plan.shard_ids, VersionSpec(), 0.0)).values
        for source in (ps, cached, cached)  # uncached, cold cache, warm cache
    ]
    assert 0 not in ps.asked  # the padding was dropped before the lookup
    assert cache.hits > 0  # the third lookup was answered from the cache
    requests = [dict(entry_inputs(plan, values, batch, unique)) for values in answers]
    for other in requests[1:]:
        assert other.keys() == requests[0].keys()
        for k, v in requests[0].items():
            np.testing.assert_array_equal(other[k], v)
    got = requests[0]
    assert sorted(got[entry_rows_input("t")][:, 0].tolist()) == [5, 7, 9, 13, 21, 22, 23, 24]  # each row once
    assert got[entry_splits_input("hist")].tolist() == [0, 3, 6, 9, 12, 15, 18]
    rows = got[entry_rows_input("t")]
    # the entry's gather + mean, in numpy, equals the pooled entry's input
    idx, splits = got[entry_index_input("hist")], got[entry_splits_input("hist")]
    mean = np.stack([rows[idx[a:b]].mean(axis=0) for a, b in itertools.pairwise(splits)])
    want = pool(plan, answers[0], batch, pooled)
    np.testing.assert_allclose(mean, want["hist"], rtol=1e-6)
    np.testing.assert_allclose(want["hist"][0], np.array([9, 18, 27], np.float32))  # mean of 5, 9, 13
    np.testing.assert_array_equal(rows[got[entry_index_input("item")]], want["item"])
    np.testing.assert_array_equal(rows[got[entry_index_input("user")]], want["user"])
