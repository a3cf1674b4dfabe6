"""Pure batching policy: split deltas by PS shard and coalesce each (model, shard, table) group, newest write wins.

:func:`split_by_shard` routes a delta's rows with :func:`schemas.partition.shard_for`. A :class:`GroupBuffer`
collects, in arrival order, the row chunks of one :class:`updater.apply.GroupKey` with their versions (producer
``timestamp_ms``, ``sequence``) and the Kafka records they came from; :meth:`GroupBuffer.build` keeps, for every id,
only its **newest** operation (an upserted row or a delete): the highest (timestamp, sequence), ties to the one that
arrived last, with that version, so the PS can compare it with the version it stores (newest wins per row there
too). Applying the built group is equivalent to applying every chunk one after the other to a newest-wins store.
Ids come out sorted, or in arrival order when no id repeats. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.deltas import EmbeddingDelta
from schemas.manifest import stream_partition_key
from schemas.partition import shard_for
from updater.apply import GroupKey, WriteGroup, WriteGroupRows

__all__ = ["Chunk", "GroupBuffer", "coalesce", "split_by_shard"]


def split_by_shard(
    delta: EmbeddingDelta, num_shards: int
) -> list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float32] | None]]:
    """``[(shard, ids, values | None)]`` for the shards ``delta`` touches, ascending; row order kept per shard.
    A delta of one shard (what producers send: one message per shard) comes back as views of its own arrays."""
    shards = shard_for(delta.ids, num_shards)
    first = int(shards[0])
    if (shards == first).all():
        return [(first, delta.ids, delta.values)]
    out = []
    for s in np.unique(shards):
        mask = shards == s
        values = None if delta.values is None else delta.values[mask]
        out.append((int(s), delta.ids[mask], values))
    return out


@dataclass(frozen=True)
class Chunk:
    """Rows of one delta for one group: ``values`` None = delete; one version for every row."""

    ids: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32] | None
    timestamp_ms: int = 0
    sequence: int = 0


def coalesce(chunks: list[Chunk], dim: int) -> WriteGroupRows:
    """Newest op per id over ``chunks`` (highest (timestamp, sequence), ties to the later arrival); ids sorted, or in
    arrival order when no id repeats. Vectorised: no Python work per row. The common bulk case (no id repeats, only
    upserts) copies each row once, into one array (none for a single chunk: its rows are passed through)."""
    if not chunks:
        e = np.zeros(0, np.int64)
        return WriteGroupRows(e, np.zeros((0, dim), np.float32), e, e, e, e, e)
    ids = np.asarray(_concat([c.ids for c in chunks]), dtype=np.int64)
    sizes = [len(c.ids) for c in chunks]
    ts = np.repeat(np.array([c.timestamp_ms for c in chunks], np.int64), sizes)
    seq = np.repeat(np.array([c.sequence for c in chunks], np.int64), sizes)
    deletes = any(c.values is None for c in chunks)
    values = _concat(
        [c.values if c.values is not None else np.zeros((len(c.ids), dim), np.float32) for c in chunks]
    ).reshape(len(ids), dim)
    if _unique(ids):
        if not deletes:  # a bulk load: every row wins, kept in arrival order, nothing gathered
            e = np.zeros(0, np.int64)
            return WriteGroupRows(ids, np.ascontiguousarray(values, np.float32), ts, seq, e, e, e)
        last = np.arange(len(ids))
    else:
        arrival = np.arange(len(ids))
        # by id, then version, then arrival: the last of each id wins
        order = np.lexsort((arrival, seq, ts, ids))
        sorted_ids = ids[order]
        last = order[np.r_[sorted_ids[1:] != sorted_ids[:-1], True]]
    is_upsert = np.repeat(np.array([c.values is not None for c in chunks]), sizes)
    up = last[is_upsert[last]]
    de = last[~is_upsert[last]]
    return WriteGroupRows(
        ids[up], np.ascontiguousarray(values[up], dtype=np.float32), ts[up], seq[up], ids[de], ts[de], seq[de]
    )


def _unique(ids: npt.NDArray[np.int64]) -> bool:
    """No id repeats: one linear pass when the ids ascend (common for bulk loads), else one unstable sort."""
    if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):
        return True
    s = np.sort(ids)
    return not bool((s[1:] == s[:-1]).any())


def _concat(arrays: list[Any]) -> Any:
    """``np.concatenate``, but a single array comes back as it is (a view of the message, no copy)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


@dataclass
class GroupBuffer:
    """Rows waiting to be written for one group, with the Kafka records and producer timestamps behind them.

    ``records`` are opaque (the consumer stores its ConsumerRecords); ``attempts``/``next_try`` belong to the
    consumer's retry policy (monotonic seconds)."""

    key: GroupKey
    dim: int
    chunks: list[Chunk] = field(default_factory=list)
    timestamps_ms: list[int] = field(default_factory=list)
    records: list[Any] = field(default_factory=list)
    attempts: int = 0
    next_try: float = 0.0

    def add(
        self,
        ids: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32] | None,
        timestamp_ms: int,
        record: Any,
        sequence: int = 0,
    ) -> None:
        self.chunks.append(Chunk(ids, values, timestamp_ms, sequence))
        self.timestamps_ms.append(timestamp_ms)
        self.records.append(record)

    def absorb(self, newer: GroupBuffer) -> None:
        """Append ``newer``'s rows after ours (they arrived later)."""
        self.chunks.extend(newer.chunks)
        self.timestamps_ms.extend(newer.timestamps_ms)
        self.records.extend(newer.records)

    @property
    def rows(self) -> int:
        return sum(len(c.ids) for c in self.chunks)

    def positions(self) -> dict[str, int]:
        """``"<topic>:<partition>"`` -> the offset after the last record behind these rows: once the group is
        written, every row of this table and shard in earlier records of that partition is applied."""
        out: dict[str, int] = {}
        for rec in self.records:
            key = stream_partition_key(rec.topic, rec.partition)
            out[key] = max(out.get(key, 0), rec.offset + 1)
        return out

    def build(self) -> WriteGroup:
        """The coalesced rows (no stream position: the consumer adds :meth:`positions` of its records)."""
        return WriteGroup(key=self.key, rows=coalesce(self.chunks, self.dim))
