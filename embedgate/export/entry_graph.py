"""The ``unique_rows`` entry's own gather + pooling, in core TensorFlow ops (stock ``tensorflow_model_server`` runs it).

A ``unique_rows`` entry (``schemas.manifest.EntryInputMode``) takes each distinct row of a batch once per table and
int32 indices into those rows per sparse feature (the inputs are named by ``schemas.manifest.entry_rows_input`` and
the functions next to it). :func:`pooled_inputs` turns them into exactly the pooled float32 [B, dim] tensors the
``pooled`` entry takes, with the formulas of :mod:`embedgate.export.pooling` (the gateway's numpy pooling):

* single feature: ``rows[index]``, times ``weights`` when the feature has weights;
* multi feature (CSR: example ``i`` owns ``index[splits[i]:splits[i+1]]``): ``sum`` = Σ w·e; ``mean`` = Σ w·e / Σ w;
  ``sqrtn`` = Σ w·e / sqrt(Σ w²); a zero row where the denominator is 0 (no ids, or every weight 0).

Rows sent as bfloat16 or float16 are cast to float32 before anything else. Padding of ``mask_zero`` features never
reaches the entry: the gateway drops id 0 before it numbers the rows (:func:`gateway.features.drop_padding`).
Ops used: ``Cast``, ``GatherV2``, ``Mul``, ``UnsortedSegmentSum``, ``Sqrt``, ``Select``, and the ``Range``/``Repeat``
ops behind ``tf.ragged.row_splits_to_segment_ids``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.manifest import (
    Combiner,
    EntryRowDtype,
    FeatureKind,
    Manifest,
    SparseFeatureSpec,
    entry_index_input,
    entry_rows_input,
    entry_splits_input,
    entry_weights_input,
)

__all__ = ["input_specs", "pool_feature", "pooled_inputs"]


def _tf_dtype(row_dtype: EntryRowDtype) -> Any:
    import tensorflow as tf

    return {
        EntryRowDtype.FLOAT32: tf.float32,
        EntryRowDtype.BFLOAT16: tf.bfloat16,
        EntryRowDtype.FLOAT16: tf.float16,
    }[row_dtype]


def input_specs(manifest: Manifest) -> list[Any]:
    """The ``tf.TensorSpec`` of every sparse input of the ``unique_rows`` entry, in a fixed order: rows per table
    read by a feature (manifest order), then per feature its index, splits (multi) and weights (weighted)."""
    import tensorflow as tf

    dims = {t.name: t.dim for t in manifest.tables}
    used = {f.table for f in manifest.sparse_features}
    row_dtype = _tf_dtype(manifest.entry.row_dtype)
    specs = [
        tf.TensorSpec([None, dims[t.name]], row_dtype, name=entry_rows_input(t.name))
        for t in manifest.tables
        if t.name in used
    ]
    for f in manifest.sparse_features:
        specs.append(tf.TensorSpec([None], tf.int32, name=entry_index_input(f.name)))
        if f.kind is FeatureKind.MULTI:
            specs.append(tf.TensorSpec([None], tf.int32, name=entry_splits_input(f.name)))
        if f.weights:
            specs.append(tf.TensorSpec([None], tf.float32, name=entry_weights_input(f.name)))
    return specs


def pool_feature(
    rows: Any, index: Any, splits: Any | None, weights: Any | None, spec: SparseFeatureSpec
) -> Any:
    """One feature's pooled float32 [B, dim] from its table's float32 ``rows`` [U, dim] and int32 ``index``;
    ``splits`` int32 [B + 1] for a multi feature (None for a single one), ``weights`` float32 like ``index`` or None
    (every weight 1)."""
    import tensorflow as tf

    gathered = tf.gather(rows, index)
    weighted = gathered if weights is None else gathered * tf.expand_dims(weights, -1)
    if spec.kind is FeatureKind.SINGLE:
        return weighted
    size = tf.shape(splits)[0] - 1
    segments = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int32)
    total = tf.math.unsorted_segment_sum(weighted, segments, size)
    if spec.combiner is Combiner.SUM:
        return total
    w = tf.ones_like(index, dtype=tf.float32) if weights is None else weights
    if spec.combiner is Combiner.MEAN:
        denom = tf.math.unsorted_segment_sum(w, segments, size)
    else:
        denom = tf.sqrt(tf.math.unsorted_segment_sum(w * w, segments, size))
    zero = tf.equal(denom, 0.0)
    safe = tf.where(zero, tf.ones_like(denom), denom)
    return tf.where(tf.expand_dims(zero, -1), tf.zeros_like(total), total / tf.expand_dims(safe, -1))


def pooled_inputs(manifest: Manifest, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Feature name -> pooled float32 [B, dim], from the ``unique_rows`` inputs (by name, as :func:`input_specs`)."""
    import tensorflow as tf

    rows = {
        t.name: tf.cast(inputs[entry_rows_input(t.name)], tf.float32)
        for t in manifest.tables
        if entry_rows_input(t.name) in inputs
    }
    out = {}
    for f in manifest.sparse_features:
        splits = inputs[entry_splits_input(f.name)] if f.kind is FeatureKind.MULTI else None
        weights = inputs[entry_weights_input(f.name)] if f.weights else None
        out[f.name] = pool_feature(rows[f.table], inputs[entry_index_input(f.name)], splits, weights, f)
    return out
