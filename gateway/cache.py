"""Hot-row cache of embedding rows in the gateway, kept fresh by the delta stream (``gateway.stream``).

Pieces, each with a narrow interface:

* :class:`RowSource` — "look up these ids per table on these shards" (the gateway's PS lookups implement it;
  ``gateway/service.py`` marks the one hook where a source is used).
* :class:`RowCache` — rows of one model by (table, id), LRU, bounded by bytes; pure and single-threaded (one event
  loop), no I/O. The stream calls :meth:`RowCache.apply_upsert` / :meth:`RowCache.apply_delete`; readers call
  :meth:`RowCache.begin_read` before a PS read and :meth:`RowCache.fill` with its answer.
* :class:`CachedRowSource` — wraps a source: hits from the cache, only misses go to the PS, answers fill the cache.

Freshness rules (docs/gateway.md "Hot-row cache" states the bound):

1. A delta updates (upsert) or drops (delete) a cached row as soon as the stream consumer decodes it, so a cached
   row is never older than the PS's once the updater applied the same delta.
2. Race between a PS read and a delta: every applied delta bumps a sequence number and records, per key, the
   sequence and the (monotonic) time it arrived. A PS answer read with token ``t`` (the sequence before the read)
   is not inserted for a key updated after ``t`` (the PS answer may predate that delta), nor for a key updated in
   the last ``settle_s`` seconds (the updater may not have written that delta to the PS yet). Such answers are
   served to that request but not cached.
3. Serving stops (every lookup goes to the PS, the cache is emptied) while the stream is down or lags more than
   ``max_lag_s``; :attr:`RowCache.serving` says so, with :attr:`RowCache.reason`.
4. When a PS answer comes from another model version than the cached rows, the cache is emptied first.

Byte accounting: a row costs ``4 * dim + ROW_OVERHEAD`` bytes (the float32 values plus an estimate of the dict
entry, the key and the array header).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = [
    "ROW_OVERHEAD",
    "CacheMetrics",
    "CachedRowSource",
    "RowCache",
    "RowSource",
    "ShardRows",
]

ROW_OVERHEAD: Final = 320  # measured with tracemalloc: ~305 bytes per cached row beyond its floats
_NO_HITS: Final = np.zeros(0, dtype=bool)

if TYPE_CHECKING:
    from gateway.core.requests import VersionSpec


@dataclass(frozen=True, eq=False)
class ShardRows:
    """Per shard: table -> float32 [len(ids), dim] in the order asked; ``versions``: the PS version that answered
    each shard ("" when it was not asked)."""

    values: list[dict[str, np.ndarray]]
    versions: tuple[str, ...]


class RowSource(Protocol):
    """Looks up rows. ``shard_ids[s][table]``: int64 ids to look up on shard ``s`` (every table a key, maybe empty).
    ``version``: what the client asked for (VersionSpec() = latest); ``deadline`` is a ``time.monotonic()`` instant."""

    async def lookup(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]], version: VersionSpec, deadline: float
    ) -> ShardRows: ...


class CacheMetrics:
    """Collectors shared by every model's cache (label ``model``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter(
            "embedgate_cache_hits", "rows answered by the hot-row cache", ["model"], registry=registry
        )
        self.misses = Counter(
            "embedgate_cache_misses",
            "rows looked up in the PS while the cache was serving",
            ["model"],
            registry=registry,
        )
        self.evictions = Counter(
            "embedgate_cache_evictions",
            "rows evicted to stay under cache.max_bytes",
            ["model"],
            registry=registry,
        )
        self.bytes = Gauge(
            "embedgate_cache_bytes", "bytes of rows held (estimate)", ["model"], registry=registry
        )
        self.serving = Gauge(
            "embedgate_cache_serving",
            "1 while the cache answers lookups, 0 while it falls back to the PS",
            ["model"],
            registry=registry,
        )
        self.stream_lag = Gauge(
            "embedgate_cache_stream_lag_seconds",
            "how far the gateway's delta stream consumer is behind (seconds since it was last caught up)",
            registry=registry,
        )
        self.deltas = Counter(
            "embedgate_cache_deltas",
            "delta messages applied to the cache, by outcome",
            ["outcome"],
            registry=registry,
        )


class RowCache:
    """Rows of one model's tables, LRU over all tables, at most ``max_bytes``. One event loop; not thread-safe.

    ``dims``: table -> dim. ``clock``: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        model: str,
        dims: Mapping[str, int],
        max_bytes: int,
        *,
        settle_s: float,
        metrics: CacheMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.dims = dict(dims)
        self._empty = {t: np.empty((0, d), dtype=np.float32) for t, d in self.dims.items()}
        self.max_bytes = max_bytes
        self.settle_s = settle_s
        self._clock = clock
        self._rows: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._bytes = 0
        self._seq = 0
        self._recent: dict[tuple[str, int], tuple[int, float]] = {}  # key -> (sequence, arrival time)
        self._readers: dict[int, int] = {}  # token -> readers holding it
        self._versions: dict[int, str] = {}
        self.version: int | None = None  # the model version the cached rows belong to (None: not pinned yet)
        self.serving = False
        self.reason = "stream not started"
        self.hits = self.misses = self.evictions = 0
        self._m = metrics
        if metrics is not None:
            metrics.serving.labels(model).set(0)

    # -- state ---------------------------------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._rows)

    def set_serving(self, serving: bool, reason: str = "") -> None:
        """Turn serving on or off; turning it off empties the cache (rows may miss deltas while off)."""
        if not serving and self.serving:
            self.clear()
        self.serving = serving
        self.reason = "" if serving else reason
        if self._m is not None:
            self._m.serving.labels(self.model).set(1 if serving else 0)

    def clear(self) -> None:
        self._rows.clear()
        self._set_bytes(0)

    def status(self) -> dict[str, object]:
        return {
            "serving": self.serving,
            "reason": self.reason,
            "rows": len(self._rows),
            "bytes": self._bytes,
            "max_bytes": self.max_bytes,
        }

    # -- reads ---------------------------------------------------------------------------------------------------
    def get(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit mask bool [n], rows float32 [hits, dim] of the hits in order); counts hits and misses."""
        rows = self._rows
        keys = [(table, i) for i in ids.tolist()]
        got = list(map(rows.get, keys))  # C-speed lookups; the loop below only filters
        mask = np.fromiter((r is not None for r in got), dtype=bool, count=len(got))
        found = [r for r in got if r is not None]
        deque(map(rows.move_to_end, itertools.compress(keys, mask.tolist())), maxlen=0)
        hits = len(found)
        self.hits += hits
        self.misses += ids.size - hits
        if self._m is not None:
            self._m.hits.labels(self.model).inc(hits)
            self._m.misses.labels(self.model).inc(ids.size - hits)
        dim = self.dims[table]
        return mask, (np.array(found, dtype=np.float32) if found else np.empty((0, dim), dtype=np.float32))

    def get_many(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]]
    ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], int]:
        """:meth:`get` for every (shard, table) of a lookup at once: per shard and table, (hit mask, rows of the
        hits in order), and the number of misses. One pass over all keys and one metrics update, whatever the number of tables and shards
        (empty id arrays cost nothing)."""
        rows = self._rows
        keys: list[tuple[str, int]] = []
        spans: list[tuple[int, str, int, int]] = []
        for s, shard in enumerate(shard_ids):
            for table, ids in shard.items():
                if ids.size:
                    start = len(keys)
                    keys.extend(zip(itertools.repeat(table), ids.tolist()))
                    spans.append((s, table, start, len(keys)))
        got = list(map(rows.get, keys))
        mask = np.fromiter((r is not None for r in got), dtype=bool, count=len(got))
        hit_keys = list(itertools.compress(keys, mask.tolist()))
        deque(map(rows.move_to_end, hit_keys), maxlen=0)
        masks: list[dict[str, np.ndarray]] = []
        found: list[dict[str, np.ndarray]] = []
        for shard in shard_ids:
            masks.append(dict.fromkeys(shard, _NO_HITS))
            found.append({t: self._empty[t] for t in shard})
        for s, table, start, end in spans:
            m = mask[start:end]
            masks[s][table] = m
            part = [r for r in got[start:end] if r is not None]
            if part:
                found[s][table] = np.array(part, dtype=np.float32)
        hits = len(hit_keys)
        self.hits += hits
        self.misses += len(keys) - hits
        if self._m is not None:
            self._m.hits.labels(self.model).inc(hits)
            self._m.misses.labels(self.model).inc(len(keys) - hits)
        return masks, found, len(keys) - hits

    def begin_read(self) -> int:
        """A token for a PS read starting now; pass it to :meth:`fill`, then call :meth:`end_read`."""
        token = self._seq
        self._readers[token] = self._readers.get(token, 0) + 1
        return token

    def end_read(self, token: int) -> None:
        left = self._readers[token] - 1
        if left:
            self._readers[token] = left
        else:
            del self._readers[token]

    def accepts_version(self, version: int | None) -> bool:
        """Whether a lookup pinned at model ``version`` (None: latest, unpinned) may use the cache: rows are held
        for one version; the first pinned version is adopted, a newer one empties the cache and is adopted, an older
        one is refused (the caller reads the PS directly)."""
        if version is None or version == self.version:
            return True
        if self.version is not None and version < self.version:
            return False
        if self.version is not None:
            self.clear()
        self.version = version
        return True

    def check_version(self, shard: int, version: str) -> None:
        """Record the PS version that answered ``shard``; another version than before empties the cache."""
        known = self._versions.get(shard)
        if known != version:
            if known is not None:
                self.clear()
            self._versions[shard] = version

    def fill(self, token: int, table: str, ids: np.ndarray, values: np.ndarray) -> int:
        """Insert PS answers read with ``token``, except keys updated since or within ``settle_s``. Returns the
        number inserted."""
        if not self.serving:
            return 0
        now = self._clock()
        recent = self._recent
        cost = 4 * self.dims[table] + ROW_OVERHEAD
        inserted = 0
        for i, row in zip(ids.tolist(), values, strict=True):
            key = (table, i)
            seen = recent.get(key)
            if seen is not None and (seen[0] > token or now - seen[1] < self.settle_s):
                continue
            if key not in self._rows:
                self._bytes += cost
                inserted += 1
            self._rows[key] = np.array(row, dtype=np.float32)  # a copy: the answer's buffer is not ours
            self._rows.move_to_end(key)
        self._evict()
        return inserted

    # -- the stream ----------------------------------------------------------------------------------------------
    def apply_upsert(self, table: str, ids: np.ndarray, values: np.ndarray) -> None:
        """A delta: ``ids`` now have exactly these rows. Cached ones change at once; others are only recorded."""
        self._seq += 1
        now = self._clock()
        for i, row in zip(ids.tolist(), values, strict=True):
            key = (table, i)
            self._recent[key] = (self._seq, now)
            if key in self._rows:
                self._rows[key] = np.array(row, dtype=np.float32)
        self._prune(now)

    def apply_delete(self, table: str, ids: np.ndarray) -> None:
        self._seq += 1
        now = self._clock()
        cost = 4 * self.dims[table] + ROW_OVERHEAD
        for i in ids.tolist():
            key = (table, i)
            self._recent[key] = (self._seq, now)
            if self._rows.pop(key, None) is not None:
                self._bytes -= cost
        self._set_bytes(self._bytes)
        self._prune(now)

    # -- internals -----------------------------------------------------------------------------------------------
    def _evict(self) -> None:
        evicted = 0
        while self._bytes > self.max_bytes and self._rows:
            (table, _), _row = self._rows.popitem(last=False)
            self._bytes -= 4 * self.dims[table] + ROW_OVERHEAD
            evicted += 1
        if evicted:
            self.evictions += evicted
            if self._m is not None:
                self._m.evictions.labels(self.model).inc(evicted)
        self._set_bytes(self._bytes)

    def _set_bytes(self, value: int) -> None:
        self._bytes = value
        if self._m is not None:
            self._m.bytes.labels(self.model).set(value)

    def _prune(self, now: float) -> None:
        """Forget keys whose delta is older than ``settle_s`` and older than every read in flight."""
        if len(self._recent) < 4096:
            return
        oldest_reader = min(self._readers, default=self._seq)
        keep = {k: v for k, v in self._recent.items() if v[0] > oldest_reader or now - v[1] < self.settle_s}
        self._recent = keep


class CachedRowSource:
    """A :class:`RowSource` answering from ``cache`` and asking ``inner`` only for misses (skipped when none)."""

    def __init__(self, inner: RowSource, cache: RowCache) -> None:
        self.inner = inner
        self.cache = cache

    async def lookup(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]], version: VersionSpec, deadline: float
    ) -> ShardRows:
        cache = self.cache
        # A label the gateway passes through names no version it knows: bypass. A version older than the cached
        # rows' (a rollout fallback) bypasses too; a newer one empties the cache first (rows differ by version).
        if not cache.serving or version.label is not None or not cache.accepts_version(version.version):
            return await self.inner.lookup(shard_ids, version, deadline)
        masks, hits, missed = cache.get_many(shard_ids)
        if not missed:
            return ShardRows(hits, ("",) * len(shard_ids))  # every row was cached: no PS call
        misses = [
            {
                table: ids if not masks[s][table].size else ids[~masks[s][table]]
                for table, ids in shard.items()
            }
            for s, shard in enumerate(shard_ids)
        ]
        token = cache.begin_read()
        try:
            answer = await self.inner.lookup(misses, version, deadline)
            for s, missed_ids in enumerate(misses):
                if any(ids.size for ids in missed_ids.values()):
                    cache.check_version(s, answer.versions[s])
                for table, ids in missed_ids.items():
                    if ids.size:
                        cache.fill(token, table, ids, answer.values[s][table])
        finally:
            cache.end_read(token)
        out: list[dict[str, np.ndarray]] = []
        for s, shard in enumerate(shard_ids):
            merged: dict[str, np.ndarray] = {}
            for table, ids in shard.items():
                mask = masks[s][table]
                got = answer.values[s][table]
                if not mask.any():
                    merged[table] = got
                    continue
                values = np.empty((ids.size, cache.dims[table]), dtype=np.float32)
                values[mask] = hits[s][table]
                values[~mask] = got
                merged[table] = values
            out.append(merged)
        return ShardRows(out, answer.versions)
