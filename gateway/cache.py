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
5. Expiring tables (``ttl_s``, set by :meth:`RowCache.set_ttl`): every cached row of such a table carries a lower
   bound of the wall-clock time (ms) of its newest write at the PS: a delta's ``timestamp_ms`` (what the PS records),
   else the newest delta timestamp the stream saw for the id, else the export time (exported rows count as written
   then). A row whose bound is older than ``ttl_s - margin_s`` is dropped by :meth:`RowCache.sweep` (run before every
   cached read and after every stream fetch), so the cache never answers a row the PS's ``expire`` may have removed;
   a PS answer whose bound is already that old is served but not cached.

Storage: each table's rows live in one float32 array (a slab, grown by doubling, freed slots reused), with an index
from id to slot (a ``dict``, or with the native path on the Rust ``SlotIndex``: :func:`gateway.native.slot_index`)
and, per slot, the tick of its last use (a counter over all tables: every row touched gets the next one, in the
order touched). A read is a few C-level passes per table (one ``SlotIndex.slots`` call, or dict lookups through
``map``; one gather, one tick assignment) however many ids it asks, not a Python loop over the ids. Eviction is
least recently used by tick, exactly; when it runs it evicts what is needed plus 1/32 of the rows held, so that its
scan for the oldest rows (linear in the rows held) runs once per ~1/32 of the cache's turnover rather than on every
fill.

Byte accounting: a row costs ``4 * dim + ROW_OVERHEAD`` bytes (the float32 values plus an estimate of the dict
entry and the slot's bookkeeping); a slab may hold up to twice its live rows' floats after growing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway import native
from schemas.manifest import (
    EntryInputMode,
    EntryRowDtype,
    FeatureKind,
    entry_index_input,
    entry_rows_input,
    entry_splits_input,
    entry_weights_input,
)
from schemas.proto import tfs_pb2

__all__ = [
    "ROW_OVERHEAD",
    "CacheMetrics",
    "CachedRowSource",
    "RowCache",
    "RowSource",
    "ShardRows",
]

# Measured with tracemalloc (~305 bytes per row beyond its floats) when each row was its own array; a slot costs
# less, so this now errs high (a slab's spare capacity, up to its live rows' floats again, is not counted).
ROW_OVERHEAD: Final = 320
_NO_HITS: Final = np.zeros(0, dtype=bool)
_MISSING: Final = -1
_FREE: Final = np.iinfo(np.int64).max  # a free slot's tick: never among the oldest
_EVICT_EXTRA: Final = 32  # an eviction also drops 1/_EVICT_EXTRA of the rows held (see the module docstring)
_NEVER: Final = np.iinfo(np.int64).max  # no expiring row held
_UNKNOWN: Final = -(2**62)  # no write time known
_MAX_SLACK_MS: Final = 60_000
_Wire = bytes  # a serialized message (inside RowCache, ``bytes`` names its byte count)
_ROW_DTYPES: Final = {
    EntryRowDtype.FLOAT32: tfs_pb2.DT_FLOAT,
    EntryRowDtype.BFLOAT16: tfs_pb2.DT_BFLOAT16,
}  # entry rows the native writer takes, and their DataType on the wire
_LAYOUTS_KEPT: Final = 8  # manifests whose entry layout a cache keeps (a model has a few versions at a time)


@dataclass(frozen=True)
class _EntryLayout:
    """What :meth:`RowCache.cached_entry_request` derives from a manifest alone, kept per manifest: the native
    writer's row dtype; per sparse feature (feature, its table's position, index input, splits input or None,
    weights input or None); per table (table, rows input; None when no feature reads the table)."""

    row_dtype: int
    features: tuple[tuple[str, int, str, str | None, str | None], ...]
    tables: tuple[tuple[str, str | None], ...]


class _Slab:
    """The cached rows of one table: ``rows`` float32 ``[capacity, dim]``, ``ids`` (the id in each slot) and
    ``used`` (the tick of each slot's last use; :data:`_FREE` for a free slot); ``index``: id -> slot, a ``dict``
    (the reference) or the native ``SlotIndex`` (:func:`gateway.native.slot_index`: the same methods, in Rust)."""

    def __init__(self, dim: int) -> None:
        self.rows = np.empty((0, dim), dtype=np.float32)
        self.ids = np.empty(0, dtype=np.int64)
        self.used = np.empty(0, dtype=np.int64)
        self.written = np.empty(
            0, dtype=np.int64
        )  # expiring tables: lower bound of each row's newest write (ms)
        self.index: dict[int, int] | SlotIndex = native.slot_index()
        self._free: list[int] = []

    def read(self, ids: np.ndarray, tick: int) -> tuple[np.ndarray, np.ndarray]:
        """(hit mask bool [n], rows float32 [hits, dim]: a copy of the held rows of the hits, in order) for ``ids``
        (int64), the k-th hit's slot marked used at ``tick + k``. One native pass with a ``SlotIndex``
        (``SlotIndex.read``); with a ``dict``, the reference: each id's slot by C-level passes (``map`` of
        ``dict.get``, not a Python loop), then numpy's mask, tick assignment and gather."""
        index = self.index
        if not isinstance(index, dict):
            return index.read(np.ascontiguousarray(ids, dtype=np.int64), self.rows, self.used, tick)
        slots = np.fromiter(
            map(index.get, ids.tolist(), itertools.repeat(_MISSING)), dtype=np.int64, count=ids.size
        )
        mask = slots != _MISSING
        held = slots[mask]
        self.used[held] = np.arange(tick, tick + held.size)
        return mask, self.rows[held]  # a gather: a copy, not a view

    def take(self, id_: int) -> int:
        """A slot for ``id_`` (not held yet)."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self.index)  # no free slot: every slot below len(index) is held
            if slot == len(self.rows):
                self._grow(max(64, 2 * len(self.rows)))
        self.index[id_] = slot
        self.ids[slot] = id_
        return slot

    def drop(self, id_: int) -> bool:
        slot = self.index.pop(id_, None)
        if slot is None:
            return False
        self.used[slot] = _FREE
        self._free.append(slot)
        return True

    def held(self) -> np.ndarray:
        """Slots in use."""
        return np.flatnonzero(self.used != _FREE)

    def _grow(self, capacity: int) -> None:
        n = len(self.rows)
        rows = np.empty((capacity, self.rows.shape[1]), dtype=np.float32)
        rows[:n] = self.rows
        self.rows = rows
        self.ids = np.concatenate([self.ids, np.zeros(capacity - n, dtype=np.int64)])
        self.used = np.concatenate([self.used, np.full(capacity - n, _FREE, dtype=np.int64)])
        self.written = np.concatenate([self.written, np.zeros(capacity - n, dtype=np.int64)])


class _Ttl:
    """Expiry state of one expiring table: ``ttl_ms``, ``margin_ms``; ``slack_ms`` (a sweep also drops rows due that
    much later, min(ttl / 32, 60 s)); ``due_ms``: the earliest wall-clock ms at which a held row is due (a lower
    bound; :data:`_NEVER` when none); ``stamps``: id -> newest delta timestamp the stream saw, for ids not (yet)
    cached, at most ``cap`` ids (past it, ids already due are forgotten, then the oldest half)."""

    def __init__(self, ttl_ms: int, margin_ms: int, cap: int) -> None:
        self.ttl_ms = ttl_ms
        self.margin_ms = margin_ms
        self.slack_ms = min(ttl_ms // _EVICT_EXTRA, _MAX_SLACK_MS)
        self.due_ms = _NEVER
        self.stamps: dict[int, int] = {}
        self._cap = cap

    def stamp(self, ids: list[int], timestamp_ms: int, now_ms: int) -> None:
        stamps = self.stamps
        for i in ids:
            if stamps.get(i, _UNKNOWN) < timestamp_ms:
                stamps[i] = timestamp_ms
        if len(stamps) > self._cap:
            cutoff = now_ms + self.margin_ms + self.slack_ms - self.ttl_ms
            keep = {i: ts for i, ts in stamps.items() if ts >= cutoff}
            if len(keep) > self._cap // 2:
                newest = np.sort(np.fromiter(keep.values(), np.int64, len(keep)))[-(self._cap // 2)]
                keep = {i: ts for i, ts in keep.items() if ts >= newest}
            self.stamps = keep


if TYPE_CHECKING:
    from embedgate_native import SlotIndex

    from gateway.core.requests import VersionSpec
    from gateway.features import FeatureBatch
    from schemas.manifest import Manifest


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
        self.expired = Counter(
            "embedgate_cache_expired",
            "rows of ttl_s tables dropped because the PS may have expired them",
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
        self._slabs = {t: _Slab(d) for t, d in self.dims.items()}
        self._cost = {t: 4 * d + ROW_OVERHEAD for t, d in self.dims.items()}
        self._tick = 1  # the next tick to hand out
        self._held = 0
        self._bytes = 0
        self._seq = 0
        self._recent: dict[tuple[str, int], tuple[int, float]] = {}  # key -> (sequence, arrival time)
        self._readers: dict[int, int] = {}  # token -> readers holding it
        self._versions: dict[int, str] = {}
        self.version: int | None = None  # the model version the cached rows belong to (None: not pinned yet)
        self.serving = False
        self.reason = "stream not started"
        self.hits = self.misses = self.evictions = self.expired = 0
        self._ttl: dict[str, _Ttl] = {}  # expiring tables only (set_ttl)
        self._wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        self._exported_ms: int | None = None
        # id(manifest) -> (the manifest, its entry layout); the manifest is kept so that its id is not reused
        self._layouts: dict[int, tuple[Manifest, _EntryLayout | None]] = {}
        self._m = metrics
        if metrics is not None:
            metrics.serving.labels(model).set(0)

    # -- state ---------------------------------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return self._held

    def set_serving(self, serving: bool, reason: str = "") -> None:
        """Turn serving on or off; turning it off empties the cache (rows may miss deltas while off)."""
        if not serving and self.serving:
            self.clear()
        self.serving = serving
        self.reason = "" if serving else reason
        if self._m is not None:
            self._m.serving.labels(self.model).set(1 if serving else 0)

    def clear(self) -> None:
        self._slabs = {t: _Slab(d) for t, d in self.dims.items()}  # releases the memory too
        for ttl in self._ttl.values():
            ttl.due_ms = _NEVER
        self._held = 0
        self._set_bytes(0)

    def status(self) -> dict[str, object]:
        return {
            "serving": self.serving,
            "reason": self.reason,
            "rows": self._held,
            "expired": self.expired,
            "bytes": self._bytes,
            "max_bytes": self.max_bytes,
        }

    # -- reads ---------------------------------------------------------------------------------------------------
    def get(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit mask bool [n], rows float32 [hits, dim] of the hits in order); counts hits and misses."""
        masks, found, _ = self.get_many([{table: ids}])
        return masks[0][table], found[0][table]

    def get_many(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]]
    ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], int]:
        """:meth:`get` for every (shard, table) of a lookup at once: per shard and table, (hit mask, rows of the
        hits in order), and the number of misses. One pass over all keys and one metrics update, whatever the number of tables and shards
        (empty id arrays cost nothing)."""
        masks: list[dict[str, np.ndarray]] = []
        found: list[dict[str, np.ndarray]] = []
        asked = hits = 0
        for shard in shard_ids:
            shard_masks = dict.fromkeys(shard, _NO_HITS)
            shard_found = {t: self._empty[t] for t in shard}
            for table, ids in shard.items():
                if not ids.size:
                    continue
                slab = self._slabs[table]
                asked += ids.size
                mask, rows = slab.read(ids, self._tick)
                shard_masks[table] = mask
                if rows.shape[0]:
                    self._tick += rows.shape[0]
                    shard_found[table] = rows
                    hits += rows.shape[0]
            masks.append(shard_masks)
            found.append(shard_found)
        self.hits += hits
        self.misses += asked - hits
        if self._m is not None:
            self._m.hits.labels(self.model).inc(hits)
            self._m.misses.labels(self.model).inc(asked - hits)
        return masks, found, asked - hits

    def cached_entry_request(self, head: _Wire, batch: FeatureBatch, manifest: Manifest) -> _Wire | None:
        """The serialized ``PredictRequest`` of a ``unique_rows`` entry whose rows go as float32 or bfloat16, for
        ``batch`` (``head``: its ``model_spec`` field), when every row it reads is cached: written natively in one
        call (:func:`gateway.native.cached_entry_request`), counted as hits and ticked as :meth:`get_many` would.
        None (nothing counted or ticked) when a row is missing, the native path is off, the entry is another kind
        (``pooled``, float16 rows), or the manifest's tables are not this cache's. What the general path gives for
        the same state (plan, :meth:`get_many`, ``gateway.embedding.entry_request``): the same bytes, ticks and
        counts."""
        layout = self._entry_layout(manifest)
        if layout is None:
            return None
        slabs = self._slabs
        features: list[
            tuple[int, np.ndarray, str, tuple[str, np.ndarray] | None, tuple[str, np.ndarray | None] | None]
        ] = []
        for name, position, index, splits, weights in layout.features:
            sparse = batch.sparse[name]
            w = sparse.weights
            features.append(
                (
                    position,
                    np.ascontiguousarray(sparse.ids, dtype=np.int64),
                    index,
                    None
                    if splits is None
                    else (splits, np.ascontiguousarray(sparse.row_splits, dtype=np.int64)),
                    None
                    if weights is None
                    else (weights, None if w is None else np.ascontiguousarray(w, np.float32)),
                )
            )
        tables = [(rows, slabs[t].index, slabs[t].rows, slabs[t].used) for t, rows in layout.tables]
        dense = [(k, np.ascontiguousarray(a, dtype=np.float32)) for k, a in batch.dense.items()]
        done = native.cached_entry_request(
            head, features, tables, dense, manifest.num_shards, self._tick, layout.row_dtype
        )
        if done is None:
            return None
        wire, hits = done
        self._tick += hits
        self.hits += hits
        if self._m is not None:
            self._m.hits.labels(self.model).inc(hits)
        return wire

    def _entry_layout(self, manifest: Manifest) -> _EntryLayout | None:
        """``manifest``'s :class:`_EntryLayout`, derived once per manifest; None when the native writer cannot
        write its entry from this cache (another input mode or row dtype, or tables this cache does not hold)."""
        known = self._layouts.get(id(manifest))
        if known is not None and known[0] is manifest:
            return known[1]
        layout: _EntryLayout | None = None
        row_dtype = _ROW_DTYPES.get(manifest.entry.row_dtype)
        slabs = self._slabs
        fits = all(t.name in slabs and slabs[t.name].rows.shape[1] == t.dim for t in manifest.tables)
        if row_dtype is not None and manifest.entry.input_mode is EntryInputMode.UNIQUE_ROWS and fits:
            position = {t.name: k for k, t in enumerate(manifest.tables)}
            read = {f.table for f in manifest.sparse_features}
            layout = _EntryLayout(
                row_dtype=row_dtype,
                features=tuple(
                    (
                        f.name,
                        position[f.table],
                        entry_index_input(f.name),
                        entry_splits_input(f.name) if f.kind is FeatureKind.MULTI else None,
                        entry_weights_input(f.name) if f.weights else None,
                    )
                    for f in manifest.sparse_features
                ),
                tables=tuple(
                    (t.name, entry_rows_input(t.name) if t.name in read else None) for t in manifest.tables
                ),
            )
        if len(self._layouts) >= _LAYOUTS_KEPT:
            self._layouts.clear()
        self._layouts[id(manifest)] = (manifest, layout)
        return layout

    def lru_order(self) -> list[tuple[str, int]]:
        """(table, id) of every row held, least recently used first (for tests and debugging; linear)."""
        keys: list[tuple[str, int]] = []
        ticks: list[int] = []
        for table, slab in self._slabs.items():
            held = slab.held()
            keys.extend(zip(itertools.repeat(table), slab.ids[held].tolist()))
            ticks.extend(slab.used[held].tolist())
        return [keys[i] for i in np.argsort(np.asarray(ticks, dtype=np.int64), kind="stable").tolist()]

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
        slab = self._slabs[table]
        cost = self._cost[table]
        inserted = 0
        slots: list[int] = []
        taken: list[int] = []  # which of ``ids`` go to ``slots``
        ttl = self._ttl.get(table)
        bounds: list[int] = []  # expiring tables: each taken row's write-time bound
        keep_from = exported = _UNKNOWN
        if ttl is not None:
            keep_from = (
                self._wall_ms() + ttl.margin_ms + ttl.slack_ms - ttl.ttl_ms
            )  # bounds older: not cached
            exported = self._exported_ms if self._exported_ms is not None else _UNKNOWN
        for n, i in enumerate(ids.tolist()):
            seen = recent.get((table, i))
            if seen is not None and (seen[0] > token or now - seen[1] < self.settle_s):
                continue
            if ttl is not None:
                bound = max(exported, ttl.stamps.get(i, _UNKNOWN))
                if bound < keep_from:
                    continue
                bounds.append(bound)
            slot = slab.index.get(i)
            if slot is None:
                slot = slab.take(i)
                inserted += 1
            slots.append(slot)
            taken.append(n)
        if slots:
            slab.rows[slots] = values[taken]  # copies: the answer's buffer is not ours
            slab.used[slots] = np.arange(
                self._tick, self._tick + len(slots)
            )  # a repeated id: its last use counts
            self._tick += len(slots)
            self._held += inserted
            self._bytes += inserted * cost
            if ttl is not None:
                slab.written[slots] = bounds
                ttl.due_ms = min(ttl.due_ms, min(bounds) + ttl.ttl_ms - ttl.margin_ms)
        self._evict()
        return inserted

    # -- the stream ----------------------------------------------------------------------------------------------
    def apply_upsert(
        self, table: str, ids: np.ndarray, values: np.ndarray, timestamp_ms: int | None = None
    ) -> None:
        """A delta: ``ids`` now have exactly these rows. Cached ones change at once; others are only recorded.
        ``timestamp_ms``: the delta's producer timestamp (what the PS records as the write time; expiring tables)."""
        self._seq += 1
        now = self._clock()
        index = self._slabs[table].index
        slots: list[int] = []
        which: list[int] = []
        id_list = ids.tolist()
        for n, i in enumerate(id_list):
            self._recent[(table, i)] = (self._seq, now)
            slot = index.get(i)
            if slot is not None:
                slots.append(slot)
                which.append(n)
        if slots:  # a repeated id: numpy's last write wins, as the delta's last row would
            self._slabs[table].rows[slots] = values[which]
        ttl = self._ttl.get(table)
        if ttl is not None and timestamp_ms is not None:
            ttl.stamp(id_list, timestamp_ms, self._wall_ms())
            if slots:
                written = self._slabs[table].written
                written[slots] = np.maximum(written[slots], timestamp_ms)
        self._prune(now)

    def apply_delete(self, table: str, ids: np.ndarray) -> None:
        self._seq += 1
        now = self._clock()
        slab = self._slabs[table]
        dropped = 0
        stamps = self._ttl[table].stamps if table in self._ttl else None
        for i in ids.tolist():
            self._recent[(table, i)] = (self._seq, now)
            dropped += slab.drop(i)
            if stamps is not None:
                stamps.pop(i, None)
        self._held -= dropped
        self._set_bytes(self._bytes - dropped * self._cost[table])
        self._prune(now)

    # -- expiry (ttl_s) -------------------------------------------------------------------------------------------
    def set_ttl(
        self,
        ttl_s: Mapping[str, float],
        *,
        exported_at_ms: int | None,
        margin_s: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Make the tables of ``ttl_s`` (table -> seconds) expiring (rule 5 of the module docstring).
        ``exported_at_ms``: when the PS's exported rows count as written (the manifest's ``exported_at_ms``; None:
        unknown, so only rows whose write the stream saw are cached). ``margin_s``: rows are dropped this much before
        their ttl (clock skew between the gateway and the updater that calls ``expire``). ``wall_clock``: seconds
        since the epoch (injectable for tests)."""
        self._wall_ms = lambda: int(wall_clock() * 1000)
        self._exported_ms = exported_at_ms
        cap = max(1 << 16, 2 * (self.max_bytes // min(self._cost.values(), default=1)))
        self._ttl = {
            t: _Ttl(int(s * 1000), int(margin_s * 1000), cap) for t, s in ttl_s.items() if t in self.dims
        }

    def sweep(self) -> int:
        """Drop the cached rows of expiring tables whose write-time bound is older than ``ttl - margin`` (and those
        due within the table's slack, so that sweeps that find something run at most once per slack). O(1) while
        nothing is due; returns the rows dropped."""
        if not self._ttl:
            return 0
        now = self._wall_ms()
        dropped = 0
        for table, ttl in self._ttl.items():
            if now < ttl.due_ms:
                continue
            slab = self._slabs[table]
            held = slab.held()
            cutoff = now + ttl.margin_ms + ttl.slack_ms - ttl.ttl_ms
            old = held[slab.written[held] < cutoff]
            for i in slab.ids[old].tolist():
                slab.drop(i)
            kept = held[slab.written[held] >= cutoff]
            ttl.due_ms = int(slab.written[kept].min()) + ttl.ttl_ms - ttl.margin_ms if kept.size else _NEVER
            dropped += old.size
            self._bytes -= old.size * self._cost[table]
        if dropped:
            self._held -= dropped
            self.expired += dropped
            if self._m is not None:
                self._m.expired.labels(self.model).inc(dropped)
            self._set_bytes(self._bytes)
        return dropped

    # -- internals -----------------------------------------------------------------------------------------------
    def _evict(self) -> None:
        """Drop the least recently used rows until under ``max_bytes``, plus 1/_EVICT_EXTRA of the rows held."""
        over = self._bytes - self.max_bytes
        if over <= 0:
            self._set_bytes(self._bytes)
            return
        tables = list(self._slabs)
        held = [self._slabs[t].held() for t in tables]
        ticks = np.concatenate([self._slabs[t].used[h] for t, h in zip(tables, held, strict=True)])
        which = np.concatenate([np.full(h.size, k, dtype=np.int64) for k, h in enumerate(held)])
        slots = np.concatenate(held)
        costs = np.asarray([self._cost[t] for t in tables], dtype=np.int64)
        # enough candidates whatever their tables: every row frees at least the cheapest row's cost
        want = min(ticks.size, -(-over // int(costs.min())) + self._held // _EVICT_EXTRA)
        oldest = np.argpartition(ticks, want - 1)[:want] if want < ticks.size else np.arange(ticks.size)
        oldest = oldest[np.argsort(ticks[oldest], kind="stable")]
        needed = int(np.searchsorted(np.cumsum(costs[which[oldest]]), over)) + 1
        evict = oldest[: min(oldest.size, needed + self._held // _EVICT_EXTRA)]
        for k, table in enumerate(tables):
            slab = self._slabs[table]
            gone = slots[evict[which[evict] == k]]
            for i in slab.ids[gone].tolist():
                slab.drop(i)
            self._bytes -= gone.size * self._cost[table]
        self._held -= evict.size
        self.evictions += evict.size
        if self._m is not None:
            self._m.evictions.labels(self.model).inc(evict.size)
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

    def cached_entry_request(
        self, head: bytes, batch: FeatureBatch, manifest: Manifest, version: VersionSpec
    ) -> bytes | None:
        """:meth:`RowCache.cached_entry_request` when a lookup at ``version`` may use the cache (as :meth:`lookup`
        decides, expired rows swept first), else None: the request of a batch whose every row is cached, with no
        plan or PS call made in Python."""
        cache = self.cache
        if not cache.serving or version.label is not None or not cache.accepts_version(version.version):
            return None
        cache.sweep()
        return cache.cached_entry_request(head, batch, manifest)

    async def lookup(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]], version: VersionSpec, deadline: float
    ) -> ShardRows:
        cache = self.cache
        # A label the gateway passes through names no version it knows: bypass. A version older than the cached
        # rows' (a rollout fallback) bypasses too; a newer one empties the cache first (rows differ by version).
        if not cache.serving or version.label is not None or not cache.accepts_version(version.version):
            return await self.inner.lookup(shard_ids, version, deadline)
        cache.sweep()  # expired rows (ttl_s) are never answered
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
