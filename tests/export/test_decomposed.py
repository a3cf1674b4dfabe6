"""Decomposed export (HPS's workflow): a dense sub-model taking pooled embeddings + HPS/numpy tables -> artifacts whose
served predictions equal dense_model(pooled(tables))."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from embedgate.cli import main
from embedgate.export.declaration import DeclarationError
from embedgate.export.tables import write_table
from schemas.manifest import Manifest

DECL = {
    "model_name": "split",
    "sparse": [
        {"name": "user", "table": "user_emb"},
        {"name": "genres", "table": "tag_emb", "kind": "multi", "combiner": "mean", "max_ids": 5},
        {
            "name": "tags",
            "table": "tag_emb",
            "kind": "multi",
            "combiner": "sqrtn",
            "weights": "tags_w",
            "max_ids": 5,
        },
        {"name": "clicks", "table": "item_emb", "kind": "multi", "combiner": "sum", "max_ids": 5},
    ],
    "dense": [{"name": "price", "dim": 1}],
    "tables": {"item_emb": {"default_value": 0.5}},
}
USER_IDS = np.array([1 << 62, -5, 17, 123_456_789_012], np.int64)


def _dense_model() -> Any:
    import keras

    keras.utils.set_random_seed(7)
    ins = [
        keras.Input((8,), name="user"),
        keras.Input((4,), name="genres"),
        keras.Input((4,), name="tags"),
        keras.Input((3,), name="clicks"),
        keras.Input((1,), name="price"),
    ]
    h = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()(list(reversed(ins))))
    ctr = keras.layers.Dense(1, activation="sigmoid", name="ctr")(h)
    score = keras.layers.Dense(2, name="score")(h)
    # Inputs listed in an order unlike the declaration's: the exporter matches them by name.
    return keras.Model([ins[3], ins[0], ins[4], ins[2], ins[1]], [ctr, score], name="dense")


def _tables(d: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    user = (USER_IDS, rng.normal(size=(4, 8)).astype(np.float32))
    tag = (np.arange(30, dtype=np.int64), rng.normal(size=(30, 4)).astype(np.float32))
    item = (np.array([3, 9, 1000], np.int64), rng.normal(size=(3, 3)).astype(np.float32))
    d.mkdir()
    write_table(d / "user_emb", *user)  # HPS
    np.save(d / "tag_emb.npy", tag[1])  # ids 0..n-1
    np.savez(d / "item_emb.npz", keys=item[0], vectors=item[1])
    return {"user_emb": user, "tag_emb": tag, "item_emb": item}


def _instances() -> list[dict[str, Any]]:
    return [
        {
            "user": int(USER_IDS[0]),
            "genres": [1, 2, 3],
            "tags": [4, 5],
            "tags_w": [0.5, 2.0],
            "clicks": [3, 9],
            "price": [0.3],
        },
        {"user": -5, "genres": [], "tags": [29], "clicks": [1000, 77], "price": 1.5},  # 77: not in item_emb
        {"user": 999, "genres": [7], "tags": [], "clicks": [], "price": [-2.0]},  # 999: unknown user
    ]


def _expected(model: Any, rows: dict[str, tuple[np.ndarray, np.ndarray]], insts: list[dict[str, Any]]) -> Any:
    def row(table: str, i: int) -> np.ndarray:
        keys, vecs = rows[table]
        hit = np.flatnonzero(keys == i)
        default = DECL["tables"].get(table, {}).get("default_value", 0.0)  # type: ignore[attr-defined]
        return vecs[hit[0]] if len(hit) else np.full(vecs.shape[1], default, np.float32)

    def pooled(table: str, ids: list[int], w: list[float], how: str) -> np.ndarray:
        dim = rows[table][1].shape[1]
        if not ids:
            return np.zeros(dim, np.float32)
        s = sum(wi * row(table, i) for i, wi in zip(ids, w, strict=True))
        return {"sum": s, "mean": s / sum(w), "sqrtn": s / np.sqrt(sum(x * x for x in w))}[how]

    x = {
        "user": np.stack([row("user_emb", i["user"]) for i in insts]),
        "genres": np.stack([pooled("tag_emb", i["genres"], [1.0] * len(i["genres"]), "mean") for i in insts]),
        "tags": np.stack(
            [pooled("tag_emb", i["tags"], i.get("tags_w", [1.0] * len(i["tags"])), "sqrtn") for i in insts]
        ),
        "clicks": np.stack([pooled("item_emb", i["clicks"], [1.0] * len(i["clicks"]), "sum") for i in insts]),
        "price": np.array([np.atleast_1d(i["price"]) for i in insts], np.float32),
    }
    out = model({k: v.astype(np.float32) for k, v in x.items()}, training=False)
    return [np.asarray(o) for o in out]


def test_cli_round_trip_predictions_equal_dense_of_pooled_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.export.tf1 import Tf1Artifacts

    model = _dense_model()
    model.save(tmp_path / "dense.keras")
    rows = _tables(tmp_path / "tables")
    (tmp_path / "decl.yaml").write_text(yaml.safe_dump(DECL))
    args = ["export", "--dense-model", str(tmp_path / "dense.keras"), "--tables", str(tmp_path / "tables")]
    args += ["--declaration", str(tmp_path / "decl.yaml"), "--out", str(tmp_path / "out"), "--shards", "3"]
    args += ["--stream-cut", "embedgate.deltas.split:0=5,embedgate.deltas.split:1=3"]
    assert main(args) == 0, capsys.readouterr().err
    assert "user_emb(4x8), tag_emb(30x4), item_emb(3x3)" in capsys.readouterr().out
    m = Manifest.load(tmp_path / "out" / "split")
    cut = {"embedgate.deltas.split:0": 5, "embedgate.deltas.split:1": 3}
    assert m.stream_cut == cut
    import tensorflow as tf

    for shard in range(3):  # every table of every shard starts at the cut
        ckpt = tf.train.load_checkpoint(
            str(tmp_path / "out" / "split" / f"ps_{shard}" / "1" / "variables" / "variables")
        )
        for t in ("user_emb", "tag_emb", "item_emb"):
            keys = [k.decode() for k in ckpt.get_tensor(f"positions/{t}/.ATTRIBUTES/table-keys")]
            offsets = ckpt.get_tensor(f"positions/{t}/.ATTRIBUTES/table-values").tolist()
            assert dict(zip(keys, offsets, strict=True)) == cut, (shard, t)
    assert [f.name for f in m.sparse_features] == ["user", "genres", "tags", "clicks"]
    assert m.sparse("tags").weights == "tags_w" and m.table("item_emb").default_value == 0.5

    insts = _instances()
    want = _expected(model, rows, insts)
    arts = Tf1Artifacts(tmp_path / "out" / "split", m)
    try:
        got = arts.predict(insts)
        np.testing.assert_array_equal(arts.lookup("user_emb", USER_IDS), rows["user_emb"][1])
    finally:
        arts.close()
    np.testing.assert_allclose(got["ctr"], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["score"], want[1], rtol=1e-5, atol=1e-5)
    assert np.ptp(want[1]) > 1e-3


def test_dense_model_must_match_the_declaration(tmp_path: Path) -> None:
    import keras

    from embedgate.export.decomposed import export_decomposed

    rows = _tables(tmp_path / "tables")
    out = tmp_path / "out"
    model = _dense_model()
    bad_name = {**DECL, "dense": [{"name": "cost", "dim": 1}]}
    with pytest.raises(
        DeclarationError, match=r"dense feature 'cost': the dense model has no input named 'cost'"
    ):
        export_decomposed(model, tmp_path / "tables", bad_name, out)
    bad_dim = {**DECL, "dense": [{"name": "price", "dim": 2}]}
    with pytest.raises(DeclarationError, match=r"input 'price' has shape \(None, 1\), expected \(None, 2\)"):
        export_decomposed(model, rows, bad_dim, out)
    wrong_rows = {**rows, "tag_emb": (rows["tag_emb"][0], np.zeros((30, 5), np.float32))}
    with pytest.raises(
        DeclarationError, match=r"sparse feature 'genres' \(pooled embedding of table 'tag_emb'\)"
    ):
        export_decomposed(model, wrong_rows, DECL, out)
    ins = [keras.Input((8,), name="user"), keras.Input((1,), name="extra")]
    extra = keras.Model(ins, keras.layers.Concatenate()(ins))
    one = {"model_name": "one", "sparse": [{"name": "user", "table": "user_emb"}]}
    with pytest.raises(DeclarationError, match=r"dense model input 'extra' is not declared"):
        export_decomposed(extra, tmp_path / "tables", one, out)
    with pytest.raises(ValueError, match=r"no table 'user_emb'"):
        export_decomposed(model, tmp_path, DECL, out)
    assert not out.exists()
