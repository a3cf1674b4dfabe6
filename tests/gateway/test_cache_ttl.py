"""gateway.cache with expiring tables (ttl_s): a cached row is dropped before the PS's expire may remove it.

A row's write time is bounded from below by the delta timestamps the stream saw, else by the export time; the wall
clock is injected. The end-to-end proof (real Kafka, serve-local, the updater's expire schedule, a gateway) is
tests/updater/test_cache_ttl_end_to_end.py."""

from __future__ import annotations

import asyncio

import numpy as np

from gateway.cache import ROW_OVERHEAD, CachedRowSource, RowCache, ShardRows
from gateway.core.requests import VersionSpec
from gateway.stream import DeltaStream
from schemas.cache_settings import CacheSettings
from schemas.manifest import Manifest

DIM = 2
TTL_S = 100.0
MARGIN_S = 5.0
EXPORTED_S = 1_000_000.0  # wall clock, seconds


class _Wall:
    def __init__(self) -> None:
        self.now = EXPORTED_S

    def __call__(self) -> float:
        return self.now


class _PS:
    """Tables "t" (expiring) and "u" (not): row of id i is [i + bump] * DIM; counts the ids asked per table."""

    def __init__(self) -> None:
        self.bump = 0.0
        self.asked = {"t": 0, "u": 0}

    async def lookup(self, shard_ids: object, version: VersionSpec, deadline: float) -> ShardRows:
        shard = shard_ids[0]  # type: ignore[index]
        out = {}
        for table, ids in shard.items():
            self.asked[table] += ids.size
            out[table] = np.repeat(ids.astype(np.float32)[:, None], DIM, axis=1) + self.bump
        return ShardRows([out], ("1",))


def _setup(exported: float | None = EXPORTED_S) -> tuple[CachedRowSource, RowCache, _PS, _Wall]:
    wall, ps = _Wall(), _PS()
    cache = RowCache("m", {"t": DIM, "u": DIM}, 1000 * (4 * DIM + ROW_OVERHEAD), settle_s=0.0)
    cache.set_ttl(
        {"t": TTL_S},
        exported_at_ms=None if exported is None else int(exported * 1000),
        margin_s=MARGIN_S,
        wall_clock=wall,
    )
    cache.set_serving(True)
    return CachedRowSource(ps, cache), cache, ps, wall


def _lookup(src: CachedRowSource, table: str, ids: list[int]) -> np.ndarray:
    shard = {"t": np.zeros(0, np.int64), "u": np.zeros(0, np.int64)}
    shard[table] = np.asarray(ids, np.int64)
    return asyncio.run(src.lookup([shard], VersionSpec(), 0.0)).values[0][table]


def test_exported_rows_are_cached_until_export_plus_ttl_minus_margin() -> None:
    src, cache, ps, wall = _setup()
    wall.now = EXPORTED_S + 10
    _lookup(src, "t", [1, 2])
    _lookup(src, "u", [1, 2])
    assert ps.asked == {"t": 2, "u": 2}
    _lookup(src, "t", [1, 2])
    assert ps.asked["t"] == 2  # hits
    wall.now = EXPORTED_S + TTL_S - MARGIN_S - 0.001
    _lookup(src, "t", [1, 2])
    assert ps.asked["t"] == 2 and cache.expired == 0
    wall.now = EXPORTED_S + TTL_S - MARGIN_S  # the PS may expire them within the margin: dropped
    _lookup(src, "t", [1, 2])
    assert ps.asked["t"] == 4 and cache.expired == 2
    # and the PS answers are not cached again: their write-time bound (the export) is already due
    _lookup(src, "t", [1, 2])
    assert ps.asked["t"] == 6
    _lookup(src, "u", [1, 2])
    assert ps.asked["u"] == 2  # a table without ttl_s keeps its rows
    assert len(cache) == 2


def test_a_delta_extends_a_cached_row_and_its_timestamp_is_what_counts() -> None:
    src, cache, ps, wall = _setup()
    wall.now = EXPORTED_S + 10
    _lookup(src, "t", [1, 2])
    written = EXPORTED_S + 50  # the producer's timestamp, not the time the gateway sees it
    wall.now = EXPORTED_S + 60
    cache.apply_upsert("t", np.array([1]), np.full((1, DIM), 9.0, np.float32), int(written * 1000))
    wall.now = EXPORTED_S + TTL_S  # 2 is past export + ttl - margin, 1 is not (written later)
    np.testing.assert_array_equal(_lookup(src, "t", [1]), [[9.0, 9.0]])
    assert ps.asked["t"] == 2 and cache.expired == 1
    wall.now = written + TTL_S - MARGIN_S
    _lookup(src, "t", [1])
    assert ps.asked["t"] == 3 and cache.expired == 2 and len(cache) == 0


def test_a_delta_seen_for_an_uncached_id_lets_its_ps_answer_be_cached() -> None:
    src, cache, ps, wall = _setup(exported=None)  # export time unknown
    wall.now = EXPORTED_S + 10
    _lookup(src, "t", [1, 2])
    _lookup(src, "t", [1, 2])
    assert ps.asked["t"] == 4  # no write time known: nothing cached
    cache.apply_upsert("t", np.array([2]), np.zeros((1, DIM), np.float32), int((EXPORTED_S + 5) * 1000))
    cache.apply_upsert(
        "t", np.array([2]), np.zeros((1, DIM), np.float32), int(EXPORTED_S * 1000)
    )  # late, older
    _lookup(src, "t", [2])
    _lookup(src, "t", [2])
    assert ps.asked["t"] == 5  # the second was a hit
    wall.now = EXPORTED_S + 5 + TTL_S - MARGIN_S  # the newest timestamp counts, not the late one
    _lookup(src, "t", [2])
    assert ps.asked["t"] == 6 and cache.expired == 1


def test_a_delete_forgets_the_timestamp() -> None:
    src, cache, ps, wall = _setup(exported=None)
    wall.now = EXPORTED_S + 10
    cache.apply_upsert("t", np.array([3]), np.zeros((1, DIM), np.float32), int(wall.now * 1000))
    cache.apply_delete("t", np.array([3]))
    _lookup(src, "t", [3])
    _lookup(src, "t", [3])
    assert ps.asked["t"] == 2


def test_sweep_releases_rows_without_reads_and_is_idle_while_nothing_is_due() -> None:
    src, cache, _, wall = _setup()
    wall.now = EXPORTED_S + 1
    _lookup(src, "t", list(range(10)))
    assert len(cache) == 10 and cache.sweep() == 0
    wall.now = EXPORTED_S + TTL_S
    before = cache.bytes
    assert cache.sweep() == 10
    assert len(cache) == 0 and cache.bytes == before - 10 * (4 * DIM + ROW_OVERHEAD)
    assert cache.status()["expired"] == 10


def test_remembered_timestamps_stay_bounded() -> None:
    cache = RowCache("m", {"t": DIM}, 10 * (4 * DIM + ROW_OVERHEAD), settle_s=0.0)
    wall = _Wall()
    cache.set_ttl({"t": TTL_S}, exported_at_ms=None, margin_s=0.0, wall_clock=wall)
    stamps = cache._ttl["t"]
    for k in range(3):
        ids = np.arange(k * 50_000, (k + 1) * 50_000, dtype=np.int64)
        cache.apply_upsert("t", ids, np.zeros((ids.size, DIM), np.float32), int(wall.now * 1000) + k)
    assert len(stamps.stamps) <= 1 << 16
    assert stamps.stamps[149_999] == int(wall.now * 1000) + 2  # the newest are kept


def test_the_stream_sets_expiry_from_the_manifest() -> None:
    manifest = Manifest.model_validate(
        {
            "model_name": "m",
            "version": 1,
            "tables": [{"name": "t", "dim": DIM, "ttl_s": TTL_S}, {"name": "u", "dim": DIM}],
            "sparse_features": [{"name": "f", "table": "t"}, {"name": "g", "table": "u"}],
            "partition": {"num_shards": 1},
            "entry": {"outputs": [{"name": "score", "shape": [1]}]},
            "ps_layout": "slab",
            "exported_at_ms": 123,
        }
    )
    cache = RowCache("m", {"t": DIM, "u": DIM}, 1 << 20, settle_s=0.0)
    DeltaStream(CacheSettings(max_bytes=1 << 20, expiry_margin_s=7), {"m": cache}, {"m": manifest})
    assert set(cache._ttl) == {"t"}
    assert cache._ttl["t"].ttl_ms == 100_000 and cache._ttl["t"].margin_ms == 7000
    assert cache._exported_ms == 123
