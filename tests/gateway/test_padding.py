"""gateway.features.drop_padding: id 0 of mask_zero features leaves the batch with its weight, as Keras's
Embedding(mask_zero=True) + a mask-aware pooling layer drops it; every JSON/tf.Example parser applies it."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.features import (
    FeatureBatch,
    SparseInput,
    batch_from_columns,
    batch_from_instances,
    drop_padding,
)
from schemas.manifest import Manifest

_MANIFEST = Manifest.model_validate(
    {
        "model_name": "m",
        "version": 1,
        "tables": [{"name": "t", "dim": 2}],
        "sparse_features": [
            {
                "name": "h",
                "table": "t",
                "kind": "multi",
                "combiner": "mean",
                "weights": "h_w",
                "mask_zero": True,
            },
            {"name": "g", "table": "t", "kind": "multi"},
        ],
        "partition": {"num_shards": 1},
        "entry": {"outputs": [{"name": "y", "shape": [1]}]},
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=6), st.booleans())
def test_drop_padding_equals_filtering_each_example(per: list[list[int]], weighted: bool) -> None:
    splits = np.concatenate([[0], np.cumsum([len(p) for p in per])]).astype(np.int64)
    ids = np.array([x for p in per for x in p], np.int64)
    weights = np.arange(ids.size, dtype=np.float32) + 0.5 if weighted else None
    same = SparseInput(ids=ids, row_splits=splits, weights=weights)
    batch = FeatureBatch(size=len(per), sparse={"h": same, "g": same}, dense={})
    out = drop_padding(batch, _MANIFEST)
    h = out.sparse["h"]
    for i, p in enumerate(per):
        lo, hi = int(h.row_splits[i]), int(h.row_splits[i + 1])
        assert h.ids[lo:hi].tolist() == [x for x in p if x != 0]
        if weighted:
            assert h.weights is not None and weights is not None
            kept = weights[splits[i] : splits[i + 1]][np.array(p, dtype=np.int64) != 0]
            assert h.weights[lo:hi].tolist() == kept.tolist()
    assert out.sparse["g"] is same  # a feature without mask_zero keeps id 0


def test_every_json_form_drops_the_padding() -> None:
    rows: list[dict[str, Any]] = [
        {"h": [5, 9, 13, 0, 0, 0], "h_w": [1, 2, 3, 4, 5, 6], "g": [0, 1]},
        {"h": [0], "g": []},
    ]
    for batch in (
        batch_from_instances(rows, _MANIFEST),
        batch_from_columns({"h": [r["h"] for r in rows], "g": [r["g"] for r in rows]}, _MANIFEST),
    ):
        assert batch.sparse["h"].ids.tolist() == [5, 9, 13]
        assert batch.sparse["h"].row_splits.tolist() == [0, 3, 3]
        assert batch.sparse["g"].ids.tolist() == [0, 1]
    w = batch_from_instances([{**rows[0]}, {"h": [0], "h_w": [7.0], "g": []}], _MANIFEST).sparse["h"].weights
    assert w is not None and w.tolist() == [1, 2, 3]
