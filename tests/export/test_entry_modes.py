"""Export of the entry input modes and of mask_zero: the CLI flags, the manifest, which features the exporter marks
``mask_zero`` (the model's own pooling decides), and the entries run in TF1 sessions (as TF Serving runs them)
against Keras on padded histories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from embedgate.cli import main
from embedgate.export.declaration import Declaration
from embedgate.export.exporter import ExportError, export_model
from schemas.manifest import EntryInputMode, EntryRowDtype, Manifest
from tests.export.conftest import DECLARATION

L = 5


def _padded_model() -> tuple[Any, dict[str, Any]]:
    """Two histories over one Embedding(mask_zero=True): ``seen`` pooled by GlobalAveragePooling1D (drops id 0),
    ``liked`` by EmbeddingPooling with an explicit 0/1 mask input (id 0 inside the mask is a row like any other)."""
    import keras

    from embedgate.export.layers import EmbeddingPooling

    keras.utils.set_random_seed(3)
    init = keras.initializers.RandomNormal(stddev=1.0, seed=3)
    seen = keras.Input((L,), dtype="int64", name="seen")
    liked = keras.Input((L,), dtype="int64", name="liked")
    liked_mask = keras.Input((L,), name="liked_mask")
    emb = keras.layers.Embedding(30, 4, mask_zero=True, embeddings_initializer=init, name="item_emb")
    s = keras.layers.GlobalAveragePooling1D(name="seen_vec")(emb(seen))
    lk = EmbeddingPooling("mean", name="liked_vec")([emb(liked), liked_mask])
    y = keras.layers.Dense(1, activation="sigmoid", name="y", kernel_initializer=init)(
        keras.layers.Concatenate()([s, lk])
    )
    decl = {
        "model_name": "padded",
        "sparse": [
            {"name": "seen", "table": "item_emb", "kind": "multi", "combiner": "mean", "pooled": "seen_vec"},
            {
                "name": "liked",
                "table": "item_emb",
                "kind": "multi",
                "combiner": "mean",
                "mask": "liked_mask",
                "pooled": "liked_vec",
            },
        ],
    }
    return keras.Model([seen, liked, liked_mask], y), decl


@pytest.mark.parametrize("mode", ["pooled", "unique_rows"])
def test_mask_zero_follows_the_models_pooling_and_padded_inputs_equal_keras(
    tmp_path: Path, mode: str
) -> None:
    from tests.export.tf1 import Tf1Artifacts

    model, decl = _padded_model()
    r = export_model(model, Declaration.model_validate(decl), tmp_path, num_shards=2, entry_input=mode)
    m = r.manifest
    assert m.sparse("seen").mask_zero and not m.sparse("liked").mask_zero
    assert m.entry.input_mode == mode and r.max_error is not None and r.max_error < 1e-5
    seen = [[5, 9, 13, 0, 0], [7, 0, 0, 0, 0], [1, 2, 3, 4, 6]]
    liked = [[3, 0], [8], [2, 4, 0]]  # an explicit 0 inside the mask: Keras pools row 0
    instances = [{"seen": s, "liked": lk} for s, lk in zip(seen, liked, strict=True)]
    padded_liked = np.zeros((3, L), np.int64)
    mask = np.zeros((3, L), np.float32)
    for i, lk in enumerate(liked):
        padded_liked[i, : len(lk)] = lk
        mask[i, : len(lk)] = 1
    want = model({"seen": np.array(seen), "liked": padded_liked, "liked_mask": mask}, training=False)
    arts = Tf1Artifacts(r.model_dir, m)
    try:
        if mode == "unique_rows":
            got = arts.entry.run("serving_default", arts.unique_feeds(instances))["y"]
        else:
            from gateway.features import FeatureBatch, SparseInput, drop_padding

            splits = {
                n: np.concatenate([[0], np.cumsum([len(i[n]) for i in instances])]).astype(np.int64)
                for n in ("seen", "liked")
            }
            batch = FeatureBatch(
                size=3,
                sparse={
                    n: SparseInput(np.array([x for i in instances for x in i[n]], np.int64), splits[n], None)
                    for n in ("seen", "liked")
                },
                dense={},
            )
            kept = drop_padding(batch, m).sparse
            assert kept["seen"].ids.tolist() == [5, 9, 13, 7, 1, 2, 3, 4, 6]
            assert kept["liked"].ids.tolist() == [3, 0, 8, 2, 4, 0]
            got = arts.predict(
                [{"seen": [x for x in s if x], "liked": lk} for s, lk in zip(seen, liked, strict=True)]
            )["y"]
    finally:
        arts.close()
    np.testing.assert_allclose(
        np.asarray(got).reshape(-1), np.asarray(want).reshape(-1), rtol=1e-5, atol=1e-6
    )


def test_cli_entry_flags(tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keras_path = tmp_path / "tiny.keras"
    tiny.model.save(keras_path)
    decl = tmp_path / "decl.yaml"
    decl.write_text(yaml.safe_dump(DECLARATION))
    base = ["export", "--model", str(keras_path), "--declaration", str(decl), "--shards", "1"]
    assert main([*base, "--out", str(tmp_path / "a"), "--entry-row-dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "entry input unique_rows (bfloat16 rows)" in out
    assert "self-check: largest prediction error against the model" in out
    m = Manifest.load(tmp_path / "a" / "tiny")
    assert (m.entry.input_mode, m.entry.row_dtype) == (EntryInputMode.UNIQUE_ROWS, EntryRowDtype.BFLOAT16)
    assert main([*base, "--out", str(tmp_path / "b"), "--entry-input", "pooled"]) == 0
    assert Manifest.load(tmp_path / "b" / "tiny").entry.input_mode is EntryInputMode.POOLED
    capsys.readouterr()
    code = main(
        [*base, "--out", str(tmp_path / "c"), "--entry-input", "pooled", "--entry-row-dtype", "float16"]
    )
    assert code != 0
    assert "entry_row_dtype float16 needs the unique_rows entry input" in capsys.readouterr().err
    assert not (tmp_path / "c" / "tiny").exists()


def test_python_api_refuses_an_unknown_mode(tiny: Any, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="entry input"):
        export_model(tiny.model, tiny.declaration, tmp_path, entry_input="sparse")
