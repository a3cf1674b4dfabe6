"""A Keras model covering every combiner and lookup kind, for the entry input mode tests (tests/gateway/
test_entry_modes_served.py, tests/export/test_entry_modes.py).

Features:

* ``user``: a ``StringLookup`` single feature (clients send strings, OOV included);
* ``words``: a ``Hashing(mask_value="")`` multi feature of strings over ``Embedding(mask_zero=True)``, mean pooled by
  ``GlobalAveragePooling1D``;
* ``hist_mean`` / ``hist_sum`` / ``hist_sqrtn`` / ``hist_wmean``: integer histories padded with 0 the way Keras input
  is padded, one ``Embedding(mask_zero=True)`` table, pooled by mask-aware layers (``GlobalAveragePooling1D`` and
  :class:`MaskedPool`, the last one with per-id weights);
* ``tags``: a weighted multi feature pooled with ``EmbeddingPooling("sqrtn")`` (no mask_zero);
* ``item``: a plain single id; ``x``: a dense feature of 3 values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

HIST_LEN = 10
TAGS_LEN = 4
WORD_BINS = 24
USERS = ["alice", "bob", "carol", "dave"]
WORDS = ["red", "green", "blue", "a longer word", "ü"]


def declaration(name: str) -> dict[str, Any]:
    hist = [
        {
            "name": f"hist_{c}",
            "table": "hist_emb",
            "kind": "multi",
            "combiner": comb,
            "pooled": f"hist_{c}_vec",
        }
        for c, comb in (("mean", "mean"), ("sum", "sum"), ("sqrtn", "sqrtn"))
    ]
    return {
        "model_name": name,
        "sparse": [
            {"name": "user", "table": "user_emb", "pooled": "user_vec"},
            {"name": "item", "table": "item_emb", "pooled": "item_vec"},
            {
                "name": "words",
                "table": "word_emb",
                "kind": "multi",
                "combiner": "mean",
                "pooled": "words_vec",
            },
            *hist,
            {
                "name": "hist_wmean",
                "table": "hist_emb",
                "kind": "multi",
                "combiner": "mean",
                "weights": "hist_wmean_w",
                "pooled": "hist_wmean_vec",
            },
            {
                "name": "tags",
                "table": "tag_emb",
                "kind": "multi",
                "combiner": "sqrtn",
                "weights": "tags_w",
                "max_ids": TAGS_LEN,
                "pooled": "tags_vec",
            },
        ],
        "dense": [{"name": "x", "dim": 3}],
    }


def _masked_pool_class() -> Any:
    import keras
    from keras import ops

    @keras.saving.register_keras_serializable(package="embedgate_tests")
    class MaskedPool(keras.layers.Layer):  # type: ignore[misc]  # Keras ships no types
        """Mask-aware pooling of ``embeddings`` or ``[embeddings, weights]``: positions the Embedding masks (id 0 of
        ``mask_zero=True``) get weight 0; ``combiner`` sum, mean or sqrtn as embedgate pools."""

        def __init__(self, combiner: str = "sum", **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.combiner = combiner
            self.supports_masking = True

        def call(self, inputs: Any, mask: Any = None) -> Any:
            if isinstance(inputs, (list, tuple)):
                emb, w = inputs
                m = mask[0] if isinstance(mask, (list, tuple)) else mask
            else:
                emb, w, m = inputs, ops.ones(ops.shape(inputs)[:2]), mask
            w = ops.cast(w, "float32")
            if m is not None:
                w = w * ops.cast(m, "float32")
            total = ops.sum(emb * ops.expand_dims(w, -1), axis=1)
            if self.combiner == "sum":
                return total
            denom = ops.sum(w, axis=1) if self.combiner == "mean" else ops.sqrt(ops.sum(w * w, axis=1))
            zero = ops.equal(denom, 0.0)
            safe = ops.where(zero, ops.ones_like(denom), denom)
            return ops.where(
                ops.expand_dims(zero, -1), ops.zeros_like(total), total / ops.expand_dims(safe, -1)
            )

        def compute_mask(self, inputs: Any, mask: Any = None) -> None:
            return None

        def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
            shape = input_shape[0] if isinstance(input_shape[0], (list, tuple)) else input_shape
            return (shape[0], shape[-1])

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "combiner": self.combiner}

    return MaskedPool


def build_model(seed: int = 7) -> Any:
    import keras

    from embedgate.export.layers import EmbeddingPooling

    masked_pool = _masked_pool_class()
    keras.utils.set_random_seed(seed)
    init = keras.initializers.RandomNormal(stddev=0.7, seed=seed)
    user = keras.Input((), dtype="string", name="user")
    item = keras.Input((), dtype="int64", name="item")
    words = keras.Input((None,), dtype="string", name="words")
    hists = {
        c: keras.Input((HIST_LEN,), dtype="int64", name=f"hist_{c}")
        for c in ("mean", "sum", "sqrtn", "wmean")
    }
    hist_w = keras.Input((HIST_LEN,), name="hist_wmean_w")
    tags = keras.Input((TAGS_LEN,), dtype="int64", name="tags")
    tags_w = keras.Input((TAGS_LEN,), name="tags_w")
    x = keras.Input((3,), name="x")
    lookup = keras.layers.StringLookup(vocabulary=USERS, name="user_lookup")
    u = keras.layers.Identity(name="user_vec")(
        keras.layers.Embedding(len(USERS) + 1, 6, embeddings_initializer=init, name="user_emb")(lookup(user))
    )
    i = keras.layers.Identity(name="item_vec")(
        keras.layers.Embedding(50, 6, embeddings_initializer=init, name="item_emb")(item)
    )
    w_bins = keras.layers.Hashing(WORD_BINS, mask_value="", name="word_hash")(words)
    w = keras.layers.GlobalAveragePooling1D(name="words_vec")(
        keras.layers.Embedding(WORD_BINS, 6, mask_zero=True, embeddings_initializer=init, name="word_emb")(
            w_bins
        )
    )
    hist_emb = keras.layers.Embedding(60, 8, mask_zero=True, embeddings_initializer=init, name="hist_emb")
    pooled = [
        keras.layers.GlobalAveragePooling1D(name="hist_mean_vec")(hist_emb(hists["mean"])),
        masked_pool("sum", name="hist_sum_vec")(hist_emb(hists["sum"])),
        masked_pool("sqrtn", name="hist_sqrtn_vec")(hist_emb(hists["sqrtn"])),
        masked_pool("mean", name="hist_wmean_vec")([hist_emb(hists["wmean"]), hist_w]),
    ]
    tag_rows = keras.layers.Embedding(40, 4, embeddings_initializer=init, name="tag_emb")(tags)
    t = EmbeddingPooling("sqrtn", name="tags_vec")([tag_rows, tags_w])
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=init)(
        keras.layers.Concatenate()([u, i, w, *pooled, t, x])
    )
    y = keras.layers.Dense(1, activation="sigmoid", name="ctr")(h)
    inputs = [user, item, words, *hists.values(), hist_w, tags, tags_w, x]
    return keras.Model(inputs, y, name="modes")


def instances(n: int = 16, seed: int = 4) -> list[dict[str, Any]]:
    """Client instances; histories padded with 0 to ``HIST_LEN`` in some examples (as Keras input is), shorter and
    unpadded in others; every history keeps at least one real id."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        inst: dict[str, Any] = {
            "user": [*USERS, "zed"][k % 5],
            "item": int(rng.integers(0, 50)),
            "words": [WORDS[int(j)] for j in rng.integers(0, len(WORDS), 1 + k % 3)],
            "x": rng.uniform(-1, 1, 3).round(3).tolist(),
        }
        if k == 1:
            inst["words"] = [*inst["words"], ""]  # the Hashing mask value, sent explicitly: padding
        for c in ("mean", "sum", "sqrtn", "wmean"):
            real = [int(v) for v in rng.integers(1, 60, 1 + (k + len(c)) % 4)]
            pad = HIST_LEN - len(real) if k % 2 == 0 else (k % 3)
            inst[f"hist_{c}"] = real + [0] * pad
        inst["hist_wmean_w"] = rng.uniform(0.2, 2.0, len(inst["hist_wmean"])).round(3).tolist()
        if k == 0:
            inst["hist_mean"] = [5, 9, 13, 0, 0, 0, 0, 0, 0, 0]  # issue 17's example
        ntags = k % (TAGS_LEN + 1)
        inst["tags"] = [int(v) for v in rng.integers(0, 40, ntags)]
        inst["tags_w"] = rng.uniform(0.2, 2.0, ntags).round(3).tolist()
        out.append(inst)
    return out


def keras_predictions(model: Any, insts: list[dict[str, Any]]) -> np.ndarray:
    """The Keras model's ctr for ``insts`` (histories padded with 0, words with "", tags with weight 0)."""
    b = len(insts)
    words_len = max(len(i["words"]) for i in insts)
    feeds: dict[str, Any] = {
        "user": np.array([i["user"] for i in insts], dtype=object),
        "item": np.array([i["item"] for i in insts], np.int64),
        "words": np.array(
            [[*i["words"], *[""] * (words_len - len(i["words"]))] for i in insts], dtype=object
        ),
        "x": np.array([i["x"] for i in insts], np.float32),
        "tags": np.zeros((b, TAGS_LEN), np.int64),
        "tags_w": np.zeros((b, TAGS_LEN), np.float32),
        "hist_wmean_w": np.zeros((b, HIST_LEN), np.float32),
    }
    for c in ("mean", "sum", "sqrtn", "wmean"):
        arr = np.zeros((b, HIST_LEN), np.int64)
        for r, inst in enumerate(insts):
            arr[r, : len(inst[f"hist_{c}"])] = inst[f"hist_{c}"]
        feeds[f"hist_{c}"] = arr
    for r, inst in enumerate(insts):
        feeds["tags"][r, : len(inst["tags"])] = inst["tags"]
        feeds["tags_w"][r, : len(inst["tags_w"])] = inst["tags_w"]
        feeds["hist_wmean_w"][r, : len(inst["hist_wmean_w"])] = inst["hist_wmean_w"]
    return np.asarray(model(feeds, training=False), np.float64).reshape(b)
