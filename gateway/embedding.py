"""Embedding lookups for one batch: dedupe ids, route them to PS shards, pool the returned rows. No I/O.

The plan and the pooling run in compiled code when the native path is on (:mod:`gateway.native`, docs/gateway.md
"Native hot path"); the numpy code here is their reference and what runs when it is off.

Flow (the caller does the I/O in between)::

    plan = plan_lookups(batch, manifest)              # per shard: table -> unique ids (sorted), every table present
    shard_values = [lookup(shard, ids) for ...]       # per shard: table -> float32 [len(ids), dim], in plan order
    pooled = pool(plan, shard_values, batch, manifest)  # sparse feature -> float32 [batch, dim]
    # or, for a ``unique_rows`` entry (manifest.entry.input_mode), nothing pooled in the gateway:
    inputs = unique_inputs(plan, shard_values, batch, manifest)  # rows__<table>, index__<f>, splits__<f>, ...

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
from typing import Final

import numpy as np

from gateway.errors import Internal
from gateway.features import FeatureBatch, SparseInput
from schemas.manifest import (
    Combiner,
    EntryInputMode,
    EntryRowDtype,
    FeatureKind,
    Manifest,
    SparseFeatureSpec,
    entry_index_input,
    entry_rows_input,
    entry_splits_input,
    entry_weights_input,
)
from schemas.partition import shard_for
from schemas.proto import tfs_pb2
from schemas.wire import Bfloat16Bits, bfloat16_bits, predict_request_for

__all__ = [
    "LookupPlan",
    "entry_inputs",
    "entry_request",
    "plan_lookups",
    "plan_lookups_reference",
    "pool",
    "unique_inputs",
    "unique_inputs_indices",
]


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
    """Dedupe ``batch``'s ids per table and route them to shards with ``shard_for``: natively
    (:func:`gateway.native.plan_lookups`, one pass with a hash map per table, without the GIL) when the native path
    is on, else :func:`plan_lookups_reference`. Both give the same plan (``tests/gateway/test_native_plan.py``);
    the native ``_rows`` are int32, the reference's intp."""
    from gateway import native

    num_shards = manifest.num_shards
    features = manifest.sparse_features
    index = {t.name: k for k, t in enumerate(manifest.tables)}
    done = native.plan_lookups(
        [batch.sparse[f.name].ids for f in features],
        [index[f.table] for f in features],
        len(index),
        num_shards,
    )
    if done is None:
        return plan_lookups_reference(batch, manifest)
    grouped, bounds, positions = done
    edges = bounds.tolist()
    num_tables = len(index)
    shard_ids = [
        {t: grouped[edges[s * num_tables + k] : edges[s * num_tables + k + 1]] for t, k in index.items()}
        for s in range(num_shards)
    ]
    rows: dict[str, np.ndarray] = {}
    offset = 0
    for f in features:
        n = batch.sparse[f.name].ids.size
        rows[f.name] = positions[offset : offset + n]
        offset += n
    return LookupPlan(shard_ids=shard_ids, _rows=rows)


def plan_lookups_reference(batch: FeatureBatch, manifest: Manifest) -> LookupPlan:
    """The pure-numpy reference of :func:`plan_lookups`.

    One pass over every table together: the ids of all features are concatenated with their table's index, sorted
    once by (table, id) (one ``np.unique`` of packed keys when ids are non-negative and small enough), deduplicated, routed with one ``shard_for`` call and grouped by (shard, table) with one
    stable sort, so the number of numpy calls does not grow with the number of tables or shards.
    """
    num_shards = manifest.num_shards
    tables = [t.name for t in manifest.tables]
    index = {t: k for k, t in enumerate(tables)}
    features = manifest.sparse_features
    parts = [batch.sparse[f.name].ids for f in features]
    sizes = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
    all_ids = np.concatenate(parts).astype(np.int64, copy=False)
    table_of = np.repeat(np.fromiter((index[f.table] for f in features), dtype=np.int64), sizes)
    num_tables = len(tables)
    shift = 63 - max(1, (num_tables - 1).bit_length())
    if all_ids.size and int(all_ids.min()) >= 0 and int(all_ids.max()) < (1 << shift):
        # the usual case: (table, id) packed into one non-negative int64, one np.unique
        keys, inverse = np.unique((table_of << shift) | all_ids, return_inverse=True)
        unique_ids = keys & ((1 << shift) - 1)
        unique_tables = keys >> shift
        inverse = inverse.reshape(-1)
    else:  # negative or huge ids: sort by (table, id) with two keys
        order = np.lexsort((all_ids, table_of))
        sorted_ids = all_ids[order]
        sorted_tables = table_of[order]
        first = np.empty(sorted_ids.size, dtype=bool)
        if sorted_ids.size:
            first[0] = True
            np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
            first[1:] |= sorted_tables[1:] != sorted_tables[:-1]
        unique_ids = sorted_ids[first]
        unique_tables = sorted_tables[first]
        inverse = np.empty(all_ids.size, dtype=np.intp)
        inverse[order] = np.cumsum(first) - 1  # position of each id in unique_ids
    if num_shards == 1:
        group = unique_tables
    else:
        shards = shard_for(unique_ids, num_shards) if unique_ids.size else np.empty(0, dtype=np.int64)
        group = shards * num_tables + unique_tables
    # (shard, table), ascending ids within each group; small integer keys make numpy's stable sort a radix sort
    small = group.astype(np.uint16) if num_shards * num_tables <= 1 << 16 else group
    by_group = np.argsort(small, kind="stable")
    bounds = np.zeros(num_shards * num_tables + 1, dtype=np.int64)
    np.cumsum(np.bincount(group, minlength=num_shards * num_tables), out=bounds[1:])
    grouped = unique_ids[by_group]
    shard_ids: list[dict[str, np.ndarray]] = [
        {
            t: grouped[bounds[s * num_tables + k] : bounds[s * num_tables + k + 1]]
            for k, t in enumerate(tables)
        }
        for s in range(num_shards)
    ]
    # Row index into a table's answers concatenated in shard order: rank among the table's groups.
    rank = np.empty(by_group.size, dtype=np.intp)
    rank[by_group] = np.arange(by_group.size, dtype=np.intp)
    table_starts = np.array(
        [[bounds[s * num_tables + k] for k in range(num_tables)] for s in range(num_shards)], dtype=np.int64
    )
    sizes_per_group = np.diff(bounds).reshape(num_shards, num_tables)
    # start of group (s, t) within table t's concatenation = sum of sizes of (s' < s, t)
    within = np.cumsum(sizes_per_group, axis=0) - sizes_per_group
    to_row = (within - table_starts).reshape(-1)  # add to the global grouped position
    unique_row = rank + to_row[group]
    position = unique_row[inverse]
    rows: dict[str, np.ndarray] = {}
    offset = 0
    for f, n in zip(features, sizes.tolist(), strict=True):
        rows[f.name] = position[offset : offset + n]
        offset += n
    return LookupPlan(shard_ids=shard_ids, _rows=rows)


def pool(
    plan: LookupPlan, shard_values: list[dict[str, np.ndarray]], batch: FeatureBatch, manifest: Manifest
) -> dict[str, np.ndarray]:
    """Combine the shards' rows into one float32 [batch.size, dim] array per sparse feature (the ``pooled`` entry).

    ``shard_values[s][table]`` must be float32-convertible [len(plan.shard_ids[s][table]), dim]; a missing table or
    a wrong shape raises :class:`gateway.errors.Internal` naming the shard and table (a PS answer we cannot use).
    """
    tables = _unique_rows(plan, shard_values, manifest)
    return {
        f.name: _pool_one(tables[f.table], plan._rows[f.name], batch, f) for f in manifest.sparse_features
    }


def _pool_one(
    table: np.ndarray, rows: np.ndarray, batch: FeatureBatch, spec: SparseFeatureSpec
) -> np.ndarray:
    """One feature pooled: natively (:func:`gateway.native.pool_feature`) when the native path is on, else
    :func:`_combine` of the gathered rows (the reference; both give the same bits)."""
    from gateway import native

    sparse = batch.sparse[spec.name]
    splits = None if spec.kind is FeatureKind.SINGLE else sparse.row_splits
    done = native.pool_feature(table, rows, splits, sparse.weights, spec.combiner.value)
    if done is not None:
        return done
    return _combine(table[rows], sparse, spec, batch.size)


def unique_inputs(
    plan: LookupPlan, shard_values: list[dict[str, np.ndarray]], batch: FeatureBatch, manifest: Manifest
) -> dict[str, np.ndarray]:
    """The sparse inputs of a ``unique_rows`` entry (schemas.manifest ``EntryInputMode``), nothing pooled here.

    Per table read by a feature, ``rows__<table>``: the batch's distinct rows, each once ([U, dim], the shards'
    answers concatenated in shard order, in ``manifest.entry.row_dtype``: float32, float16, or
    :class:`schemas.wire.Bfloat16Bits`). Per sparse feature ``index__<f>`` int32 (each id's row in its table's rows;
    [B] single, [nnz] multi), for a multi feature ``splits__<f>`` int32 [B + 1] (the batch's row splits) and for a
    feature with weights ``weights__<f>`` float32 like the index (1 where the client sent none). Same shape checks
    and errors as :func:`pool`.
    """
    tables = _unique_rows(plan, shard_values, manifest)
    row_dtype = manifest.entry.row_dtype
    out: dict[str, np.ndarray] = {}
    for name, rows in tables.items():
        key = entry_rows_input(name)
        if row_dtype is EntryRowDtype.BFLOAT16:
            out[key] = bfloat16_bits(rows)
        elif row_dtype is EntryRowDtype.FLOAT16:
            out[key] = rows.astype(np.float16)
        else:
            out[key] = rows
    out.update(unique_inputs_indices(plan, batch, manifest))
    return out


def unique_inputs_indices(
    plan: LookupPlan, batch: FeatureBatch, manifest: Manifest
) -> list[tuple[str, np.ndarray]]:
    """The per-feature inputs of a ``unique_rows`` entry (:func:`unique_inputs` without the rows), in order:
    ``index__<f>`` int32, ``splits__<f>`` int32 (multi features), ``weights__<f>`` float32 (features with weights)."""
    out: list[tuple[str, np.ndarray]] = []
    for f in manifest.sparse_features:
        sparse = batch.sparse[f.name]
        out.append((entry_index_input(f.name), plan._rows[f.name].astype(np.int32, copy=False)))
        if f.kind is FeatureKind.MULTI:
            out.append((entry_splits_input(f.name), sparse.row_splits.astype(np.int32)))
        if f.weights:
            w = sparse.weights
            out.append(
                (
                    entry_weights_input(f.name),
                    np.ones(sparse.ids.size, np.float32) if w is None else w.astype(np.float32, copy=False),
                )
            )
    return out


def entry_inputs(
    plan: LookupPlan, shard_values: list[dict[str, np.ndarray]], batch: FeatureBatch, manifest: Manifest
) -> list[tuple[str, np.ndarray]]:
    """Every input of the entry for ``manifest.entry.input_mode``, in signature order: :func:`pool` (float32) or
    :func:`unique_inputs`, then the dense features (float32); what :func:`schemas.wire.predict_request_for` frames."""
    if manifest.entry.input_mode is EntryInputMode.POOLED:
        sparse = {
            k: np.asarray(v, dtype=np.float32) for k, v in pool(plan, shard_values, batch, manifest).items()
        }
    else:
        sparse = unique_inputs(plan, shard_values, batch, manifest)
    dense = [(k, np.asarray(a, dtype=np.float32)) for k, a in batch.dense.items()]
    return [*sparse.items(), *dense]


def _unique_rows(
    plan: LookupPlan, shard_values: list[dict[str, np.ndarray]], manifest: Manifest
) -> dict[str, np.ndarray]:
    """Per table read by a sparse feature: float32 [U, dim], the shards' answers concatenated in shard order (the
    row numbering of ``plan._rows``)."""
    return {
        name: parts[0] if len(parts) == 1 else np.concatenate(parts)
        for name, parts in _table_parts(plan, shard_values, manifest).items()
    }


def _table_parts(
    plan: LookupPlan, shard_values: list[dict[str, np.ndarray]], manifest: Manifest
) -> dict[str, list[np.ndarray]]:
    """Per table read by a sparse feature: each shard's answer, float32 [len(ids), dim], in shard order (checked:
    a missing table or a wrong shape raises :class:`gateway.errors.Internal` naming the shard and table)."""
    num_shards = manifest.num_shards
    if len(shard_values) != num_shards or len(plan.shard_ids) != num_shards:
        raise Internal(f"expected lookup answers from {num_shards} PS shards, got {len(shard_values)}")
    used = {f.table for f in manifest.sparse_features}
    tables: dict[str, list[np.ndarray]] = {}
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
        tables[t.name] = parts
    return tables


def entry_request(
    spec: tfs_pb2.ModelSpec,
    plan: LookupPlan,
    shard_values: list[dict[str, np.ndarray]],
    batch: FeatureBatch,
    manifest: Manifest,
) -> bytes:
    """The serialized entry ``PredictRequest`` at ``spec`` for ``manifest.entry.input_mode``: written natively in
    one pass when the native path is on (:func:`gateway.native.entry_request`: a ``unique_rows`` table's rows go in
    as each shard answered them, copied once into the request, never concatenated first), else
    :func:`schemas.wire.predict_request_for` of :func:`entry_inputs` (the reference). Both give the same bytes
    (``tests/gateway/test_native_entry.py``)."""
    from gateway import native

    head = tfs_pb2.PredictRequest(model_spec=spec).SerializeToString()
    if native.path() == "native":
        wire = native.entry_request(head, _native_inputs(plan, shard_values, batch, manifest))
        if wire is not None:
            return wire
    return predict_request_for(spec, entry_inputs(plan, shard_values, batch, manifest))


_WIRE_DTYPES: Final = {
    np.dtype(np.float32): tfs_pb2.DT_FLOAT,
    np.dtype(np.int32): tfs_pb2.DT_INT32,
    np.dtype(np.float16): tfs_pb2.DT_HALF,
}


def _wire(name: str, array: np.ndarray) -> tuple[str, int, tuple[int, ...], list[np.ndarray]]:
    """One input for :func:`gateway.native.entry_request`: float32, int32, float16 or :class:`Bfloat16Bits`."""
    dtype = tfs_pb2.DT_BFLOAT16 if isinstance(array, Bfloat16Bits) else _WIRE_DTYPES[array.dtype]
    return name, dtype, array.shape, [array]


def _native_inputs(
    plan: LookupPlan, shard_values: list[dict[str, np.ndarray]], batch: FeatureBatch, manifest: Manifest
) -> list[tuple[str, int, tuple[int, ...], list[np.ndarray]]]:
    """:func:`entry_inputs` as :func:`gateway.native.entry_request` takes them, in the same order; float32 rows of
    a ``unique_rows`` entry as one part per shard (the reference concatenates them)."""
    entry = manifest.entry
    if entry.input_mode is EntryInputMode.POOLED or entry.row_dtype is not EntryRowDtype.FLOAT32:
        return [_wire(k, a) for k, a in entry_inputs(plan, shard_values, batch, manifest)]
    out: list[tuple[str, int, tuple[int, ...], list[np.ndarray]]] = []
    for name, parts in _table_parts(plan, shard_values, manifest).items():
        rows = sum(p.shape[0] for p in parts)
        out.append((entry_rows_input(name), tfs_pb2.DT_FLOAT, (rows, parts[0].shape[1]), parts))
    out.extend(_wire(k, a) for k, a in unique_inputs_indices(plan, batch, manifest))
    out.extend(_wire(k, np.asarray(a, dtype=np.float32)) for k, a in batch.dense.items())
    return out


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
