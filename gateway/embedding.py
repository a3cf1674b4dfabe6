"""Embedding lookups for one batch: dedupe ids, route them to PS shards, pool the returned rows. Pure numpy, no I/O.

Flow (the caller does the I/O in between)::

    plan = plan_lookups(batch, manifest)              # per shard: table -> unique ids (sorted), every table present
    shard_values = [lookup(shard, ids) for ...]       # per shard: table -> float32 [len(ids), dim], in plan order
    pooled = pool(plan, shard_values, batch, manifest)  # sparse feature -> float32 [batch, dim]

Ids are deduplicated per **table** across the whole batch (all examples and every feature reading that table) and
routed with :func:`schemas.partition.shard_for`. Pooling (manifest ``Combiner``), in float32 like the exporter's
Keras layer; ``w`` is 1 where no weights were sent:

* single feature: the row, times its weight when weights were sent (the combiner does not apply);
* ``sum``: Σ w·e;
* ``mean``: Σ w·e / Σ w (a zero row when Σ w == 0);
* ``sqrtn``: Σ w·e / sqrt(Σ w²) (a zero row when Σ w² == 0, e.g. no ids).

Unknown ids come back from the PS as the table's default row and are pooled like any row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gateway.errors import Internal
from gateway.features import FeatureBatch, SparseInput
from schemas.manifest import Combiner, FeatureKind, Manifest, SparseFeatureSpec
from schemas.partition import shard_for

__all__ = ["LookupPlan", "plan_lookups", "pool"]


@dataclass(frozen=True, eq=False)
class LookupPlan:
    """What to ask each PS shard for, and how to scatter the answers back.

    ``shard_ids[s][table]``: the unique int64 ids (ascending) shard ``s`` must look up in ``table``; every table of
    the manifest is a key for every shard, maybe with an empty array. ``_rows`` (private) maps each sparse feature to,
    per id of the feature in the batch, the row index into its table's shard answers concatenated in shard order.
    """

    shard_ids: list[dict[str, np.ndarray]]
    _rows: dict[str, np.ndarray] = field(repr=False)

    @property
    def num_ids(self) -> int:
        """Unique ids over every table and shard (what the PS will look up)."""
        return sum(int(ids.size) for shard in self.shard_ids for ids in shard.values())


def plan_lookups(batch: FeatureBatch, manifest: Manifest) -> LookupPlan:
    """Dedupe ``batch``'s ids per table and route them to shards with ``shard_for``."""
    num_shards = manifest.num_shards
    by_table: dict[str, list[SparseFeatureSpec]] = {t.name: [] for t in manifest.tables}
    for f in manifest.sparse_features:
        by_table[f.table].append(f)
    shard_ids: list[dict[str, np.ndarray]] = [{} for _ in range(num_shards)]
    rows: dict[str, np.ndarray] = {}
    for table, features in by_table.items():
        parts = [np.asarray(batch.sparse[f.name].ids, dtype=np.int64) for f in features]
        all_ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        unique, inverse = np.unique(all_ids, return_inverse=True)
        if num_shards == 1:
            shard_ids[0][table] = unique
            position = inverse.reshape(-1)
        else:
            shards = shard_for(unique, num_shards) if unique.size else np.empty(0, dtype=np.int64)
            order = np.argsort(shards, kind="stable")  # grouped by shard, ascending ids within a shard
            bounds = np.zeros(num_shards + 1, dtype=np.int64)
            np.cumsum(np.bincount(shards, minlength=num_shards), out=bounds[1:])
            grouped = unique[order]
            for s in range(num_shards):
                shard_ids[s][table] = grouped[bounds[s] : bounds[s + 1]]
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size, dtype=order.dtype)
            position = rank[inverse.reshape(-1)]
        offset = 0
        for f, ids in zip(features, parts, strict=True):
            rows[f.name] = position[offset : offset + ids.size].astype(np.intp, copy=False)
            offset += ids.size
    return LookupPlan(shard_ids=shard_ids, _rows=rows)


def pool(
    plan: LookupPlan, shard_values: list[dict[str, np.ndarray]], batch: FeatureBatch, manifest: Manifest
) -> dict[str, np.ndarray]:
    """Combine the shards' rows into one float32 [batch.size, dim] array per sparse feature.

    ``shard_values[s][table]`` must be float32-convertible [len(plan.shard_ids[s][table]), dim]; a missing table or
    a wrong shape raises :class:`gateway.errors.Internal` naming the shard and table (a PS answer we cannot use).
    """
    num_shards = manifest.num_shards
    if len(shard_values) != num_shards or len(plan.shard_ids) != num_shards:
        raise Internal(f"expected lookup answers from {num_shards} PS shards, got {len(shard_values)}")
    used = {f.table for f in manifest.sparse_features}
    tables: dict[str, np.ndarray] = {}
    for t in manifest.tables:
        if t.name not in used:
            continue
        parts = []
        for s in range(num_shards):
            values = shard_values[s].get(t.name)
            expected = (plan.shard_ids[s][t.name].size, t.dim)
            if values is None:
                raise Internal(f"PS shard {s} returned no values for table {t.name!r}")
            values = np.asarray(values, dtype=np.float32)
            if values.shape != expected:
                raise Internal(
                    f"PS shard {s} returned values of shape {list(values.shape)} for table {t.name!r}, "
                    f"expected {list(expected)}"
                )
            parts.append(values)
        tables[t.name] = parts[0] if num_shards == 1 else np.concatenate(parts)
    return {
        f.name: _combine(tables[f.table][plan._rows[f.name]], batch.sparse[f.name], f, batch.size)
        for f in manifest.sparse_features
    }


def _combine(rows: np.ndarray, sparse: SparseInput, spec: SparseFeatureSpec, size: int) -> np.ndarray:
    """rows: float32 [nnz, dim], one per id of the feature in batch order -> float32 [size, dim]."""
    weights = sparse.weights
    weighted = rows if weights is None else rows * weights[:, None]
    if spec.kind is FeatureKind.SINGLE:
        return weighted
    dim = rows.shape[1]
    lengths = np.diff(sparse.row_splits)
    nonempty = lengths > 0
    summed = np.zeros((size, dim), dtype=np.float32)
    if weighted.shape[0]:
        starts = sparse.row_splits[:-1][nonempty]
        summed[nonempty] = np.add.reduceat(weighted, starts, axis=0)
    if spec.combiner is Combiner.SUM:
        return summed
    if spec.combiner is Combiner.MEAN:
        denom = _segment_sum(weights, sparse.row_splits, nonempty, lengths)
    else:
        squares = None if weights is None else weights * weights
        denom = np.sqrt(_segment_sum(squares, sparse.row_splits, nonempty, lengths))
    out = np.zeros_like(summed)
    ok = denom != 0
    out[ok] = summed[ok] / denom[ok, None]
    return out


def _segment_sum(
    values: np.ndarray | None, row_splits: np.ndarray, nonempty: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """float32 [size]: per example, the sum of ``values`` over its ids (the id count when ``values`` is None)."""
    if values is None:
        return lengths.astype(np.float32)
    out = np.zeros(lengths.size, dtype=np.float32)
    if values.size:
        out[nonempty] = np.add.reduceat(values, row_splits[:-1][nonempty])
    return out
