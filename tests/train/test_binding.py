"""A model that does not match the manifest is refused when ``StreamRows`` is built, naming the table or layer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from embedgate.train.binding import NO_KEY, ModelMismatchError, bind_model
from gateway.lookup_mapping import OOV_KEY, load_lookups, string_key
from tests.train.conftest import Exported
from tests.train.tiny import CATS, build


def _variant(**changes: Any) -> Any:
    """The tiny model with one thing changed: ``dim`` of item_emb, ``vocab`` of the lookup, ``rename`` a table,
    ``extra`` Embedding."""
    import keras

    item = keras.Input((), dtype="int64", name="item")
    cat = keras.Input((), dtype="string", name="cat")
    tag = keras.Input((), dtype="string", name="tag")
    price = keras.Input((1,), name="price")
    item_name = changes.get("rename", "item_emb")
    vecs = [keras.layers.Embedding(40, changes.get("dim", 4), name=item_name)(item)]
    vocab = changes.get("vocab", CATS)
    vecs.append(
        keras.layers.Embedding(len(vocab) + 1, 4, name="cat_emb")(
            keras.layers.StringLookup(vocabulary=vocab, name="cat_lookup")(cat)
        )
    )
    vecs.append(
        keras.layers.Embedding(8, 4, name="tag_emb")(
            keras.layers.Hashing(changes.get("bins", 8), name="tag_hash")(tag)
        )
    )
    if changes.get("extra"):
        vecs.append(keras.layers.Embedding(5, 4, name="side_emb")(item))
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([*vecs, price]))
    return keras.Model([item, cat, tag, price], out)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dim": 3}, r"table 'item_emb': Embedding layer 'item_emb' has dim 3, the manifest 4"),
        ({"rename": "items"}, r"Embedding layer 'items' is not a table of model 'tiny'"),
        ({"extra": True}, r"Embedding layer 'side_emb' is not a table of model 'tiny'"),
        (
            {"vocab": [*CATS[:4], "cat_77"]},
            r"table 'cat_emb': lookup layer 'cat_lookup' does not map values as the exported lookups.json",
        ),
        ({"bins": 6}, r"table 'tag_emb': lookup layer 'tag_hash' does not map values"),
    ],
)
def test_a_mismatched_model_is_refused(change: dict[str, Any], message: str, tiny_export: Exported) -> None:
    with pytest.raises(ModelMismatchError, match=message):
        bind_model(_variant(**change), tiny_export.manifest, load_lookups(tiny_export.model_dir))


def test_stream_rows_refuses_at_construction(tiny_export: Exported, monkeypatch: pytest.MonkeyPatch) -> None:
    import embedgate.train.publisher as mod
    from embedgate.train import StreamRows
    from tests.train.test_publisher import _FakePublisher

    monkeypatch.setattr(mod, "DeltaPublisher", _FakePublisher)
    with pytest.raises(ModelMismatchError, match="has dim 3"):
        StreamRows(tiny_export.model_dir, "unused:1", model=_variant(dim=3))


def test_keys_are_the_exporters(tiny_export: Exported) -> None:
    model = build()
    bindings = {
        b.table: b for b in bind_model(model, tiny_export.manifest, load_lookups(tiny_export.model_dir))
    }
    assert bindings["item_emb"].key_of_row.tolist() == list(range(40))
    assert bindings["cat_emb"].key_of_row.tolist() == [OOV_KEY, *[string_key(c) for c in CATS]]
    assert bindings["tag_emb"].key_of_row.tolist() == list(range(8))
    assert NO_KEY not in bindings["cat_emb"].key_of_row
    rows, keys = bindings["cat_emb"].served(np.asarray([0, 2], np.int64))
    assert rows.tolist() == [0, 2] and keys.tolist() == [OOV_KEY, string_key(CATS[1])]


def test_stream_rows_serves_its_metrics_when_asked(
    tiny_export: Exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    import urllib.request

    import embedgate.train.publisher as mod
    from embedgate.train import StreamRows
    from tests.train.test_publisher import _FakePublisher

    monkeypatch.setattr(mod, "DeltaPublisher", _FakePublisher)
    _FakePublisher.gate.set()
    model = build()
    with StreamRows(tiny_export.model_dir, "unused:1", model=model, metrics_port=0, log_every=1) as stream:
        assert stream.metrics_port
        emb = model.get_layer("item_emb")
        emb.embeddings.assign(emb.embeddings.numpy() + np.eye(40, 4, dtype=np.float32))  # rows 0..3 change
        assert stream.publish_now() == 4
        stream.publisher.flush(timeout=30)
        url = f"http://127.0.0.1:{stream.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert 'embedgate_trainer_rows_total{table="item_emb"} 4.0' in resp.read().decode()
    with StreamRows(tiny_export.model_dir, "unused:1", model=model, log_every=0) as quiet:
        assert quiet.metrics_port is None and quiet.metrics is None  # off by default
