"""A tiny click model for the trainer-side tests: ``item`` (plain table ``item_emb``, 40 rows), ``cat`` (strings
through ``StringLookup`` into ``cat_emb``), ``tag`` (strings through ``Hashing(8)`` into ``tag_emb``), ``price``
(dense). Built from a fixed seed: every call returns the same weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from embedgate.export.declaration import Declaration

CATS = [f"cat_{i:02d}" for i in range(1, 6)]
ITEMS = 40
DECLARATION = Declaration.model_validate(
    {
        "model_name": "tiny",
        "sparse": [
            {"name": "item", "table": "item_emb", "pooled": "item_vec"},
            {"name": "cat", "table": "cat_emb", "pooled": "cat_vec"},
            {"name": "tag", "table": "tag_emb", "pooled": "tag_vec"},
        ],
        "dense": [{"name": "price", "dim": 1}],
    }
)


def build(seed: int = 3) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    item = keras.Input((), dtype="int64", name="item")
    cat = keras.Input((), dtype="string", name="cat")
    tag = keras.Input((), dtype="string", name="tag")
    price = keras.Input((1,), name="price")
    item_vec = keras.layers.Identity(name="item_vec")(keras.layers.Embedding(ITEMS, 4, name="item_emb")(item))
    cat_ids = keras.layers.StringLookup(vocabulary=CATS, name="cat_lookup")(cat)
    cat_vec = keras.layers.Identity(name="cat_vec")(
        keras.layers.Embedding(len(CATS) + 1, 4, name="cat_emb")(cat_ids)
    )
    tag_ids = keras.layers.Hashing(8, name="tag_hash")(tag)
    tag_vec = keras.layers.Identity(name="tag_vec")(keras.layers.Embedding(8, 4, name="tag_emb")(tag_ids))
    x = keras.layers.Concatenate()([item_vec, cat_vec, tag_vec, price])
    x = keras.layers.Dense(4, activation="relu", name="hidden")(x)
    out = keras.layers.Dense(1, activation="sigmoid", name="click")(x)
    return keras.Model([item, cat, tag, price], out, name="tiny")


def examples(n: int, seed: int = 0, items: int = ITEMS) -> tuple[dict[str, Any], Any]:
    """``n`` examples (Keras inputs, labels; strings as tf string tensors, which ``fit`` takes); ``items`` limits
    the item ids used (0..items-1)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    item = rng.integers(0, items, n).astype(np.int64)
    cat = np.asarray([CATS[i] if i < len(CATS) else "cat_99" for i in rng.integers(0, len(CATS) + 1, n)])
    tag = np.asarray([f"tag{i}" for i in rng.integers(0, 20, n)])
    price = rng.uniform(0, 1, (n, 1)).astype(np.float32)
    label = ((item % 3 == 0) ^ (price[:, 0] > 0.5)).astype(np.float32)
    strings = {"cat": tf.constant(cat.tolist()), "tag": tf.constant(tag.tolist())}
    return {"item": item, **strings, "price": price}, label
