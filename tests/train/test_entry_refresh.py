"""Entry-only export: a new entry version with new dense weights runs with the current PS version; mismatches are
refused; predicts through the gateway never fail across an entry refresh and then match the refreshed model."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedgate.export.exporter import ExportError, export_model
from schemas.manifest import Manifest
from tests.train.tiny import CATS, DECLARATION, build

INSTANCES = [
    {"item": 3, "cat": "cat_02", "tag": "tag5", "price": [0.4]},
    {"item": 17, "cat": "cat_99", "tag": "tag1", "price": [0.9]},
]


def _keras_predict(model: Any, instances: list[dict[str, Any]]) -> np.ndarray:
    import tensorflow as tf

    x = {
        "item": tf.constant([i["item"] for i in instances], tf.int64),
        "cat": tf.constant([i["cat"] for i in instances]),
        "tag": tf.constant([i["tag"] for i in instances]),
        "price": tf.constant([i["price"] for i in instances], tf.float32),
    }
    return np.asarray(model(x, training=False))


def _scale_dense(model: Any, factor: float) -> None:
    """Change only dense weights (the tables stay as exported)."""
    layer = model.get_layer("click")
    kernel, bias = layer.get_weights()
    layer.set_weights([kernel * factor, bias + 0.1])


def test_entry_only_export_pairs_with_the_current_ps_version(tmp_path: Path) -> None:
    from embedgate.export.entry_refresh import export_entry

    model = build()
    full = export_model(model, DECLARATION, tmp_path, num_shards=2)
    d = full.model_dir
    _scale_dense(model, 2.0)
    r = export_entry(model, DECLARATION, tmp_path)
    assert (r.version, r.manifest.ps_version, r.manifest.ps_version_served) == (2, 1, 1)
    assert (d / "entry" / "2" / "saved_model.pb").is_file()
    assert not (d / "ps_0" / "2").exists() and not (d / "ps_1" / "2").exists()
    on_disk = Manifest.load(d)
    assert on_disk == r.manifest and on_disk.ps_layout_key == full.manifest.ps_layout_key
    assert json.loads((d / "manifest.json").read_text())["ps_version"] == 1
    assert "ps_version" not in json.loads(full.manifest.dumps())  # a full export's manifest is unchanged
    # a second and third refresh still read PS version 1; old entry versions beyond keep_entry_versions go
    for _ in range(3):
        r = export_entry(model, DECLARATION, tmp_path, keep_entry_versions=2)
    assert (r.version, r.manifest.ps_version) == (5, 1)
    assert sorted(p.name for p in (d / "entry").iterdir()) == ["1", "4", "5"]  # 1: the PS version's own entry


def test_entry_only_export_refuses_another_layout(tmp_path: Path) -> None:
    import keras

    from embedgate.export.entry_refresh import export_entry

    export_model(build(), DECLARATION, tmp_path, num_shards=2)
    before = (tmp_path / "tiny" / "manifest.json").read_text()
    wider = build()
    item = keras.Input((), dtype="int64", name="item")
    cat = keras.Input((), dtype="string", name="cat")
    tag = keras.Input((), dtype="string", name="tag")
    price = keras.Input((1,), name="price")
    vecs = [
        keras.layers.Identity(name="item_vec")(keras.layers.Embedding(40, 5, name="item_emb")(item)),
        keras.layers.Identity(name="cat_vec")(
            keras.layers.Embedding(7, 4, name="cat_emb")(
                keras.layers.StringLookup(vocabulary=[*CATS, "cat_06"], name="cat_lookup")(cat)
            )
        ),
        keras.layers.Identity(name="tag_vec")(
            keras.layers.Embedding(8, 4, name="tag_emb")(keras.layers.Hashing(8, name="tag_hash")(tag))
        ),
    ]
    wider = keras.Model(
        [item, cat, tag, price],
        keras.layers.Dense(1, name="click")(keras.layers.Concatenate()([*vecs, price])),
    )
    with pytest.raises(ExportError, match=r"table 'item_emb': \(4, 0.0, False\) -> \(5, 0.0, False\)"):
        export_entry(wider, DECLARATION, tmp_path)
    assert (tmp_path / "tiny" / "manifest.json").read_text() == before
    assert sorted(p.name for p in (tmp_path / "tiny" / "entry").iterdir()) == ["1"]
    with pytest.raises(ExportError, match="needs an existing export"):
        export_entry(build(), DECLARATION, tmp_path / "nothing")


def test_entry_only_export_refuses_another_vocabulary(tmp_path: Path) -> None:
    import keras

    from embedgate.export.entry_refresh import export_entry

    export_model(build(), DECLARATION, tmp_path, num_shards=2)
    model = build()
    model.get_layer("cat_lookup").set_vocabulary([*CATS[:4], "cat_77"])
    assert isinstance(model, keras.Model)
    with pytest.raises(
        ExportError, match=r"sparse feature 'cat': lookup layer 'cat_lookup' maps values other"
    ):
        export_entry(model, DECLARATION, tmp_path)


@pytest.mark.integration
async def test_predicts_never_fail_across_entry_refreshes(tmp_path: Path) -> None:
    """Clients predict continuously while two entry-only versions roll out; every answer is 200, and the last ones
    come from the newest entry (over PS version 1) and equal the refreshed Keras model's predictions."""
    from embedgate.export.entry_refresh import export_entry
    from tests.gateway.conftest import app_client
    from tests.support.servers import serve_local

    model = build()
    full = export_model(model, DECLARATION, tmp_path, num_shards=2)
    d = full.model_dir
    served = {"tiny_entry": d / "entry", "tiny_ps_0": d / "ps_0", "tiny_ps_1": d / "ps_1"}
    body = json.dumps({"instances": INSTANCES})
    with serve_local(served, poll_seconds=0.2) as srv:
        config = {
            "kind": "embedding",
            "name": "tiny",
            "manifest": str(d),
            "entry": srv.target,
            "shards": [{"replicas": [srv.target]}, {"replicas": [srv.target]}],
        }
        async with app_client(models=[config]) as gw:
            outcomes: dict[str, int] = {}
            failures: list[str] = []
            versions: list[str] = []
            stop = asyncio.Event()

            async def client() -> None:
                while not stop.is_set():
                    r = await gw.post("/v1/models/tiny:predict", content=body)
                    outcomes[str(r.status_code)] = outcomes.get(str(r.status_code), 0) + 1
                    if r.status_code != 200:
                        failures.append(r.text)
                    meta = await gw.get("/v1/models/tiny")
                    versions.extend(
                        s["version"] for s in meta.json()["model_version_status"] if s["state"] == "AVAILABLE"
                    )
                    await asyncio.sleep(0.01)

            clients = [asyncio.create_task(client()) for _ in range(4)]
            try:
                for factor in (1.5, 3.0):
                    _scale_dense(model, factor)
                    r = await asyncio.to_thread(export_entry, model, DECLARATION, tmp_path)
                    assert r.manifest.ps_version == 1
                    want = _keras_predict(model, INSTANCES)
                    for _ in range(600):  # the newest entry answers once serve-local loaded it
                        resp = await gw.post("/v1/models/tiny:predict", content=body)
                        if resp.status_code == 200 and np.allclose(
                            resp.json()["predictions"], want, rtol=1e-5, atol=1e-6
                        ):
                            break
                        await asyncio.sleep(0.1)
                    else:
                        pytest.fail(
                            f"entry version {r.version} never answered: {resp.status_code} {resp.text}"
                        )
                await asyncio.sleep(1.0)  # keep predicting across the old version's unload
            finally:
                stop.set()
                await asyncio.gather(*clients)
    assert failures == [], f"{len(failures)} failed predicts ({outcomes}): {failures[:3]}"
    assert outcomes.get("200", 0) > 20
    assert "3" in versions
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.integration
def test_trainer_exports_record_the_stream_cut_and_stream_rows_refreshes_the_entry(
    kafka: Any, tmp_path: Path, unique: str
) -> None:
    """``export_with_cut`` flushes the publisher and records the topic's end offsets; ``StreamRows(entry_every_s=0)``
    writes an entry version at a batch end, after the rows it trained were acknowledged."""
    from embedgate.train import RowPublisher, StreamRows, export_with_cut
    from tests.train.tiny import examples

    model = build()
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    first = export_model(model, DECLARATION, tmp_path, num_shards=2)
    topic = f"{unique}.deltas"
    with RowPublisher(first.model_dir, kafka.bootstrap, topic=topic) as pub:
        pub.publish("item_emb", np.arange(6), np.ones((6, 4)))
        second = export_with_cut(model, DECLARATION, tmp_path, pub, self_check=False)
        cut = second.manifest.stream_cut
        assert set(cut) == {f"{topic}:{p}" for p in range(4)}  # max(4 partitions, 2 shards)
        assert sum(cut.values()) == pub.stats().messages == 2  # one message per shard, all before the cut
        stream = StreamRows(
            second.model_dir,
            publisher=pub,
            every_n_batches=1,
            entry_every_s=0.0,
            declaration=DECLARATION,
            export_root=tmp_path,
            log_every=0,
        )
        x, y = examples(32, seed=2)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[stream])
    assert stream.entry_versions == [3, 4]  # one per batch end
    m = Manifest.load(second.model_dir)
    assert (m.version, m.ps_version) == (4, 2)
    assert stream.rows_published > 0


def test_entry_only_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    model = build()
    export_model(model, DECLARATION, tmp_path / "models", num_shards=2)
    _scale_dense(model, 2.0)
    model.save(tmp_path / "tiny.keras")
    decl = tmp_path / "decl.yaml"
    decl.write_text(yaml.safe_dump(DECLARATION.model_dump(mode="json", exclude_none=True)))
    common = [
        "--model",
        str(tmp_path / "tiny.keras"),
        "--declaration",
        str(decl),
        "--out",
        str(tmp_path / "models"),
    ]
    root = Path(__file__).resolve().parents[2]

    def cli(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "embedgate", "export", "--entry-only", *common, *extra]
        return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600, check=False)

    ok = cli()
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "entry version 2, running with PS version 1" in ok.stdout
    bad = cli("--stream-cut", "auto")
    assert bad.returncode == 2 and "--entry-only takes --model" in bad.stderr
    assert Manifest.load(tmp_path / "models" / "tiny").ps_version == 1
