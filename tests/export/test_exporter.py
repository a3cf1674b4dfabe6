from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from schemas.manifest import Manifest


def test_layout_and_manifest(tiny: Any) -> None:
    d = tiny.export.model_dir
    m = Manifest.load(d)
    assert m == tiny.export.manifest
    assert m.version == 1 and m.num_shards == 3
    assert (d / "entry" / "1" / "saved_model.pb").is_file()
    for i in range(3):
        assert (d / f"ps_{i}" / "1" / "saved_model.pb").is_file()
    assert [t.name for t in m.tables] == ["user_emb", "tag_emb", "item_emb"]
    assert [(t.dim, t.rows) for t in m.tables] == [(8, 300), (4, 120), (6, 500)]
    assert m.table("item_emb").default_value == 0.25
    assert [o.name for o in m.entry.outputs] == ["ctr", "score"]
    assert [o.shape for o in m.entry.outputs] == [[1], [2]]
    assert m.sparse("tags").weights == "tags_w" and m.sparse("genres").weights is None
    assert not list(d.parent.glob(".*"))  # no temp dir left behind


def test_predictions_through_entry_and_ps_match_keras(tiny: Any, tiny_tf1: Any, tmp_path: Path) -> None:
    expected = tiny.model.predict(tiny.keras_inputs, verbose=0)
    got = tiny_tf1.predict(tiny.instances)
    np.testing.assert_allclose(got["ctr"], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["score"], expected[1], rtol=1e-5, atol=1e-5)
    assert np.ptp(got["ctr"]) > 1e-3  # the examples differ: the comparison is not vacuous
    tiny.model.save(tmp_path / "still_saveable.keras")  # export did not alter the model


def test_entry_signature_inputs(tiny_tf1: Any) -> None:
    """The default (unique_rows) entry: rows per table, int32 indices (+ splits for multi, weights for weighted)."""
    sd = tiny_tf1.entry.signatures["serving_default"]
    shapes = {k: ([d.size for d in v.tensor_shape.dim], v.dtype) for k, v in sd.inputs.items()}
    f32, i32 = 1, 3  # DT_FLOAT, DT_INT32
    assert shapes == {
        "rows__user_emb": ([-1, 8], f32),
        "rows__tag_emb": ([-1, 4], f32),
        "rows__item_emb": ([-1, 6], f32),
        "index__user": ([-1], i32),
        "index__genres": ([-1], i32),
        "splits__genres": ([-1], i32),
        "index__tags": ([-1], i32),
        "splits__tags": ([-1], i32),
        "weights__tags": ([-1], f32),
        "index__clicks": ([-1], i32),
        "splits__clicks": ([-1], i32),
        "weights__clicks": ([-1], f32),
        "index__recent": ([-1], i32),
        "splits__recent": ([-1], i32),
        "weights__recent": ([-1], f32),
        "price": ([-1, 1], f32),
        "ctx": ([-1, 3], f32),
    }
    assert set(sd.outputs) == {"ctr", "score"}
    assert tiny_tf1.manifest.entry.input_mode == "unique_rows"


def test_pooled_entry_signature_inputs(tiny_pooled: Any) -> None:
    """``entry_input="pooled"``: one pooled float32 row per sparse feature, as before the unique_rows mode."""
    from tests.export.tf1 import Tf1Artifacts

    arts = Tf1Artifacts(tiny_pooled.model_dir, tiny_pooled.manifest)
    try:
        sd = arts.entry.signatures["serving_default"]
    finally:
        arts.close()
    assert tiny_pooled.manifest.entry.input_mode == "pooled"
    shapes = {k: [d.size for d in v.tensor_shape.dim] for k, v in sd.inputs.items()}
    assert shapes == {
        "user": [-1, 8],
        "genres": [-1, 4],
        "tags": [-1, 4],
        "clicks": [-1, 6],
        "recent": [-1, 6],
        "price": [-1, 1],
        "ctx": [-1, 3],
    }
    assert all(v.dtype == 1 for v in sd.inputs.values())  # DT_FLOAT
    assert set(sd.outputs) == {"ctr", "score"}
