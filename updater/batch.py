"""Pure batching policy: split deltas by PS shard and coalesce each (model, shard, table) group, last write wins.

:func:`split_by_shard` routes a delta's rows with :func:`schemas.partition.shard_for`. A :class:`GroupBuffer`
collects, in arrival order, the row chunks of one :class:`updater.apply.GroupKey` together with the Kafka records
they came from; :meth:`GroupBuffer.build` keeps, for every id, only its **last** operation (the last upserted row,
or a delete), in the order those last operations arrived. Applying the built group is equivalent to applying every
chunk one after the other. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.deltas import EmbeddingDelta
from schemas.partition import shard_for
from updater.apply import GroupKey, WriteGroup

__all__ = ["GroupBuffer", "coalesce", "split_by_shard"]


def split_by_shard(
    delta: EmbeddingDelta, num_shards: int
) -> list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float32] | None]]:
    """``[(shard, ids, values | None)]`` for the shards ``delta`` touches, ascending; row order kept per shard."""
    shards = shard_for(delta.ids, num_shards)
    out = []
    for s in np.unique(shards):
        mask = shards == s
        values = None if delta.values is None else delta.values[mask]
        out.append((int(s), delta.ids[mask], values))
    return out


def coalesce(
    chunks: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]], dim: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Last op per id over ``chunks`` (``values`` None = delete): ``(upsert_ids, upsert_values, delete_ids)``, each
    in the order the surviving operations arrived."""
    if not chunks:
        return np.zeros(0, np.int64), np.zeros((0, dim), np.float32), np.zeros(0, np.int64)
    ids = np.concatenate([c[0] for c in chunks]).astype(np.int64, copy=False)
    is_upsert = np.concatenate([np.full(len(c[0]), c[1] is not None) for c in chunks])
    values = np.concatenate(
        [c[1] if c[1] is not None else np.zeros((len(c[0]), dim), np.float32) for c in chunks]
    ).reshape(len(ids), dim)
    _, rev_index = np.unique(ids[::-1], return_index=True)
    last = np.sort(len(ids) - 1 - rev_index)
    up = last[is_upsert[last]]
    de = last[~is_upsert[last]]
    return ids[up], np.ascontiguousarray(values[up], dtype=np.float32), ids[de]


@dataclass
class GroupBuffer:
    """Rows waiting to be written for one group, with the Kafka records and producer timestamps behind them.

    ``records`` are opaque (the consumer stores its ConsumerRecords); ``attempts``/``next_try`` belong to the
    consumer's retry policy (monotonic seconds)."""

    key: GroupKey
    dim: int
    chunks: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]] = field(default_factory=list)
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
    ) -> None:
        self.chunks.append((ids, values))
        self.timestamps_ms.append(timestamp_ms)
        self.records.append(record)

    def absorb(self, newer: GroupBuffer) -> None:
        """Append ``newer``'s rows after ours (they arrived later)."""
        self.chunks.extend(newer.chunks)
        self.timestamps_ms.extend(newer.timestamps_ms)
        self.records.extend(newer.records)

    @property
    def rows(self) -> int:
        return sum(len(c[0]) for c in self.chunks)

    def build(self) -> WriteGroup:
        up_ids, up_values, del_ids = coalesce(self.chunks, self.dim)
        return WriteGroup(key=self.key, upsert_ids=up_ids, upsert_values=up_values, delete_ids=del_ids)
