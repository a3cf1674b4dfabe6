"""embedgate.export.entry_graph (the unique_rows entry's gather + pooling in TF) against the gateway's numpy pooling,
fed by the gateway's own ``unique_inputs``: random manifests and batches (every combiner, single and multi, weights
signed and zero, empty lists, negative and huge ids, 1-5 shards), float32 and reduced-precision rows."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.embedding import plan_lookups, pool, unique_inputs
from gateway.errors import Internal
from gateway.features import FeatureBatch
from schemas.manifest import (
    EntryInputMode,
    FeatureKind,
    Manifest,
    entry_index_input,
    entry_rows_input,
    entry_splits_input,
)
from schemas.wire import Bfloat16Bits
from tests.gateway.test_embedding import FakePS, _setup

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _unique(manifest: Manifest, row_dtype: str = "float32") -> Manifest:
    data = manifest.model_dump(mode="json")
    data["entry"].update(input_mode=EntryInputMode.UNIQUE_ROWS.value, row_dtype=row_dtype)
    return Manifest.model_validate(data)


def _tf_pooled(manifest: Manifest, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tensorflow as tf

    from embedgate.export.entry_graph import pooled_inputs

    feeds = {}
    for k, v in inputs.items():
        if isinstance(v, Bfloat16Bits):
            feeds[k] = tf.bitcast(tf.constant(v.view(np.ndarray)), tf.bfloat16)
        else:
            feeds[k] = tf.constant(v)
    return {k: v.numpy() for k, v in pooled_inputs(manifest, feeds).items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=_setup(), seed=st.integers(0, 2**32 - 1))
def test_entry_pools_unique_rows_as_the_gateway_pools(
    setup: tuple[Manifest, FeatureBatch], seed: int
) -> None:
    pooled_manifest, batch = setup
    manifest = _unique(pooled_manifest)
    plan = plan_lookups(batch, manifest)
    values = FakePS(manifest, seed).lookup(plan)
    want = pool(plan, values, batch, pooled_manifest)
    inputs = unique_inputs(plan, values, batch, manifest)
    for t in manifest.tables:  # each distinct id of a table once
        if entry_rows_input(t.name) in inputs:
            distinct = {
                int(i)
                for f in manifest.sparse_features
                if f.table == t.name
                for i in batch.sparse[f.name].ids
            }
            assert inputs[entry_rows_input(t.name)].shape == (len(distinct), t.dim)
    for f in manifest.sparse_features:
        assert inputs[entry_index_input(f.name)].dtype == np.int32
        if f.kind is FeatureKind.MULTI:
            assert inputs[entry_splits_input(f.name)].tolist() == batch.sparse[f.name].row_splits.tolist()
    got = _tf_pooled(manifest, inputs)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("row_dtype", ["bfloat16", "float16"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=_setup(), seed=st.integers(0, 2**32 - 1))
def test_reduced_precision_rows_pool_within_their_rounding(
    row_dtype: str, setup: tuple[Manifest, FeatureBatch], seed: int
) -> None:
    pooled_manifest, batch = setup
    manifest = _unique(pooled_manifest, row_dtype)
    plan = plan_lookups(batch, manifest)
    values = FakePS(manifest, seed).lookup(plan)
    want = pool(plan, values, batch, pooled_manifest)
    got = _tf_pooled(manifest, unique_inputs(plan, values, batch, manifest))
    eps = 2.0**-8 if row_dtype == "bfloat16" else 2.0**-11  # relative rounding of one element
    for f in manifest.sparse_features:
        sp = batch.sparse[f.name]
        w = np.abs(sp.weights) if sp.weights is not None else np.ones(sp.ids.size, np.float32)
        # |error| <= eps * sum |w| * max|row| (rows are in [-1, 1]) divided by the combiner's denominator: bound it
        # by eps * (sum |w|) / (smallest nonzero denominator) loosely as eps * 64 over these small batches
        np.testing.assert_allclose(
            got[f.name], want[f.name], rtol=0, atol=eps * 64 * max(1.0, float(w.max(initial=0)))
        )


def test_unique_inputs_refuse_a_short_shard_answer() -> None:
    manifest = _unique(
        Manifest.model_validate(
            {
                "model_name": "m",
                "version": 1,
                "tables": [{"name": "t", "dim": 2}],
                "sparse_features": [{"name": "f", "table": "t"}],
                "partition": {"num_shards": 1},
                "entry": {"outputs": [{"name": "y", "shape": [1]}]},
            }
        )
    )
    from gateway.features import SparseInput

    batch = FeatureBatch(
        size=2, sparse={"f": SparseInput(np.array([3, 4]), np.arange(3, dtype=np.int64), None)}, dense={}
    )
    plan = plan_lookups(batch, manifest)
    with pytest.raises(Internal, match=r"PS shard 0 returned values of shape \[1, 2\] for table 't'"):
        unique_inputs(plan, [{"t": np.zeros((1, 2), np.float32)}], batch, manifest)
