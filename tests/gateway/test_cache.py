"""gateway.cache: LRU by bytes, stream updates, the PS-read race, serving off, and the hit rate on Zipf traffic."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

from gateway.cache import ROW_OVERHEAD, CachedRowSource, RowCache, ShardRows
from gateway.core.requests import VersionSpec

DIM = 4
ROW = 4 * DIM + ROW_OVERHEAD


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _FakePS:
    """One shard, table "t": row of id i is [i, i, i, i] + ``bump``; records what it was asked."""

    def __init__(self) -> None:
        self.bump = 0.0
        self.asked: list[list[int]] = []
        self.before_answer: asyncio.Event | None = None
        self.during: list[object] = []

    async def lookup(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]], version: VersionSpec, deadline: float
    ) -> ShardRows:
        ids = shard_ids[0]["t"]
        self.asked.append(ids.tolist())
        for hook in self.during:
            hook()  # type: ignore[operator]
        values = np.repeat(ids.astype(np.float32)[:, None], DIM, axis=1) + self.bump
        return ShardRows([{"t": values}], ("1",))


def _cache(max_rows: int = 100, settle_s: float = 0.0, clock: _Clock | None = None) -> RowCache:
    c = RowCache("m", {"t": DIM}, max_rows * ROW, settle_s=settle_s, clock=clock or _Clock())
    c.set_serving(True)
    return c


def _lookup(src: CachedRowSource, ids: list[int]) -> np.ndarray:
    got = asyncio.run(src.lookup([{"t": np.array(ids, dtype=np.int64)}], VersionSpec(), 0.0))
    return got.values[0]["t"]


def test_hits_skip_the_ps_and_answers_keep_order() -> None:
    ps, cache = _FakePS(), _cache()
    src = CachedRowSource(ps, cache)
    np.testing.assert_array_equal(_lookup(src, [3, 1])[:, 0], [3, 1])
    np.testing.assert_array_equal(_lookup(src, [1, 5, 3])[:, 0], [1, 5, 3])
    assert ps.asked == [[3, 1], [5]]
    assert (cache.hits, cache.misses) == (2, 3)
    _lookup(src, [1, 3, 5])
    assert len(ps.asked) == 2  # all hits: the PS is not asked
    assert cache.hits == 5


def test_bounded_by_bytes_least_recently_used_goes_first() -> None:
    ps, cache = _FakePS(), _cache(max_rows=2)
    src = CachedRowSource(ps, cache)
    _lookup(src, [1])
    _lookup(src, [2])
    _lookup(src, [1])  # 1 is now the most recent
    _lookup(src, [3])  # evicts 2
    assert cache.bytes == 2 * ROW and cache.evictions == 1
    ps.asked.clear()
    _lookup(src, [1, 2, 3])
    assert ps.asked == [[2]]


def test_stream_updates_and_deletes_cached_rows() -> None:
    ps, cache = _FakePS(), _cache()
    src = CachedRowSource(ps, cache)
    _lookup(src, [7, 8])
    cache.apply_upsert("t", np.array([7]), np.full((1, DIM), 0.5, dtype=np.float32))
    cache.apply_delete("t", np.array([8]))
    ps.bump = 1000.0
    got = _lookup(src, [7, 8])
    assert got[0].tolist() == [0.5] * DIM  # the streamed row, without asking the PS
    assert got[1, 0] == 1008.0  # deleted from the cache: read from the PS again
    assert ps.asked[-1] == [8]


def test_a_ps_answer_read_before_a_delta_never_overwrites_it() -> None:
    ps, cache = _FakePS(), _cache()
    src = CachedRowSource(ps, cache)
    # the delta for id 4 arrives while the PS read (which returns the old row) is in flight
    ps.during.append(lambda: cache.apply_upsert("t", np.array([4]), np.full((1, DIM), 9.0, dtype=np.float32)))
    first = _lookup(src, [4])
    assert first[0, 0] == 4.0  # this request got the PS's answer ...
    ps.during.clear()
    ps.bump = 5.0  # ... which was not cached: the next read asks the PS again (it has the delta by now)
    assert _lookup(src, [4])[0, 0] == 9.0
    assert ps.asked == [[4], [4]]


def test_recently_updated_keys_are_not_filled_until_settled() -> None:
    clock = _Clock()
    ps, cache = _FakePS(), _cache(settle_s=5.0, clock=clock)
    src = CachedRowSource(ps, cache)
    cache.apply_upsert(
        "t", np.array([4]), np.full((1, DIM), 9.0, dtype=np.float32)
    )  # not cached: only recorded
    _lookup(src, [4])
    _lookup(src, [4])
    assert ps.asked == [[4], [4]]  # the updater may not have written it yet: not cached
    clock.now += 5.0
    _lookup(src, [4])
    _lookup(src, [4])
    assert ps.asked == [[4], [4], [4]]


def test_off_means_every_lookup_goes_to_the_ps_and_the_cache_empties() -> None:
    ps, cache = _FakePS(), _cache()
    src = CachedRowSource(ps, cache)
    _lookup(src, [1, 2])
    cache.set_serving(False, "delta stream lags 9.0 s")
    assert len(cache) == 0 and cache.bytes == 0 and cache.status()["reason"] == "delta stream lags 9.0 s"
    _lookup(src, [1, 2])
    assert ps.asked == [[1, 2], [1, 2]] and len(cache) == 0


def test_a_new_ps_version_empties_the_cache() -> None:
    ps, cache = _FakePS(), _cache()
    src = CachedRowSource(ps, cache)
    _lookup(src, [1])
    cache.check_version(0, "2")
    assert len(cache) == 0


def test_zipf_hit_rate() -> None:
    """Zipf(1.2) ids over 100 000 rows, cache for 5 % of them: LRU answers most rows (the figure is in the docs)."""
    rng = np.random.default_rng(0)
    ps, cache = _FakePS(), _cache(max_rows=5000)
    src = CachedRowSource(ps, cache)
    for _ in range(300):
        batch = np.unique(np.minimum(rng.zipf(1.2, 64), 100_000))
        _lookup(src, batch.tolist())
    rate = cache.hits / (cache.hits + cache.misses)
    print(f"zipf(1.2) hit rate with 5% of rows cached: {rate:.3f}")
    assert rate > 0.5


def test_rows_are_held_for_one_pinned_version() -> None:
    ps = _FakePS()
    cache = _cache()
    src = CachedRowSource(ps, cache)

    def look(version: int) -> None:
        asyncio.run(src.lookup([{"t": np.array([1, 2], dtype=np.int64)}], VersionSpec(version=version), 0.0))

    look(1)
    look(1)
    assert len(ps.asked) == 1  # v1 rows cached
    look(2)  # a newer version: the v1 rows are dropped, v2 read and cached
    assert len(ps.asked) == 2 and cache.version == 2
    look(2)
    assert len(ps.asked) == 2
    look(1)  # an older version (a rollout fallback) never reads v2 rows: straight to the PS
    look(1)
    assert len(ps.asked) == 4 and cache.version == 2
    asyncio.run(src.lookup([{"t": np.array([1], dtype=np.int64)}], VersionSpec(label="canary"), 0.0))
    assert len(ps.asked) == 5  # a passed-through label names no known version


def test_get_many_is_get_for_every_shard_and_table() -> None:
    """One pass over every (shard, table) answers what per-table gets answer, and counts hits, misses and LRU
    recency the same way (empty id arrays included)."""
    rng = np.random.default_rng(5)

    def filled() -> RowCache:
        cache = RowCache("m", {"a": DIM, "b": 2}, max_bytes=10**6, settle_s=0.0)
        cache.set_serving(True)
        ids = np.arange(0, 40, 2, dtype=np.int64)
        cache.fill(cache.begin_read(), "a", ids, np.repeat(ids[:, None], DIM, axis=1).astype(np.float32))
        cache.fill(cache.begin_read(), "b", ids, np.repeat(ids[:, None], 2, axis=1).astype(np.float32))
        return cache

    for _ in range(20):
        shard_ids = [
            {t: np.unique(rng.integers(0, 40, rng.integers(0, 8))).astype(np.int64) for t in ("a", "b")}
            for _ in range(3)
        ]
        one, many = filled(), filled()
        masks, found, missed = many.get_many(shard_ids)
        for s, shard in enumerate(shard_ids):
            for t, ids in shard.items():
                mask, rows = one.get(t, ids)
                np.testing.assert_array_equal(masks[s][t], mask)
                assert found[s][t].shape == rows.shape and found[s][t].dtype == np.float32
                np.testing.assert_array_equal(found[s][t], rows)
        assert (many.hits, many.misses) == (one.hits, one.misses) and missed == one.misses
        assert many.lru_order() == one.lru_order()  # the same LRU order


def test_rows_match_a_plain_lru_of_arrays_under_mixed_operations() -> None:
    """The slab-backed cache (slots handed out, freed by evictions and deletes, reused, slabs grown; eviction by
    tick in batches) answers exactly what a plain LRU dict of row arrays answers, over random fills, stream upserts
    and deletes and reads on two tables of different widths and costs."""
    rng = np.random.default_rng(11)
    dims = {"a": DIM, "b": 2}
    cost = {t: 4 * d + ROW_OVERHEAD for t, d in dims.items()}
    max_bytes = 150 * cost["a"]  # small enough that fills evict and slots get reused
    cache = RowCache("m", dims, max_bytes, settle_s=0.0)
    cache.set_serving(True)
    ref: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()

    def ref_evict() -> None:
        if sum(cost[t] for t, _ in ref) <= max_bytes:
            return
        extra = len(ref) // 32  # an eviction also drops 1/32 of the rows held
        while sum(cost[t] for t, _ in ref) > max_bytes:
            ref.popitem(last=False)
        for _ in range(min(extra, len(ref))):
            ref.popitem(last=False)

    for step in range(400):
        table = ("a", "b")[int(rng.integers(0, 2))]
        ids = rng.integers(0, 400, int(rng.integers(0, 40))).astype(np.int64)
        values = rng.standard_normal((ids.size, dims[table])).astype(np.float32)
        op = int(rng.integers(0, 4))
        if op == 0:
            cache.fill(cache.begin_read(), table, ids, values)
            for i, row in zip(ids.tolist(), values, strict=True):
                ref[(table, i)] = row.copy()
                ref.move_to_end((table, i))
            ref_evict()
        elif op == 1:
            cache.apply_upsert(table, ids, values)
            for i, row in zip(ids.tolist(), values, strict=True):
                if (table, i) in ref:
                    ref[(table, i)] = row.copy()
        elif op == 2:
            cache.apply_delete(table, ids)
            for i in ids.tolist():
                ref.pop((table, i), None)
        else:
            asked = [
                {t: np.unique(rng.integers(0, 400, 30)).astype(np.int64) for t in dims} for _ in range(2)
            ]
            masks, found, _ = cache.get_many(asked)
            for s, shard in enumerate(asked):
                for t, want in shard.items():
                    expect = [ref[(t, i)] for i in want.tolist() if (t, i) in ref]
                    np.testing.assert_array_equal(masks[s][t], [(t, i) in ref for i in want.tolist()])
                    np.testing.assert_array_equal(
                        found[s][t], np.array(expect, np.float32).reshape(-1, dims[t]), err_msg=f"step {step}"
                    )
                    for i in want.tolist():
                        if (t, i) in ref:
                            ref.move_to_end((t, i))
        assert cache.lru_order() == list(ref), f"LRU order differs at step {step}"
        assert cache.bytes == sum(cost[t] for t, _ in ref)
