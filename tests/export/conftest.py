"""A small purpose-built model (every combiner, single/multi/weighted/masked, a shared table) exported once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

L = 6  # padded length of the multi-valued Keras inputs
DECLARATION = {
    "model_name": "tiny",
    "sparse": [
        {"name": "user", "table": "user_emb", "pooled": "user_vec"},
        {
            "name": "genres",
            "table": "tag_emb",
            "kind": "multi",
            "combiner": "mean",
            "mask": "genres_mask",
            "max_ids": L,
            "pooled": "genres_pool",
        },
        {
            "name": "tags",
            "table": "tag_emb",
            "kind": "multi",
            "combiner": "sqrtn",
            "weights": "tags_w",
            "max_ids": L,
            "pooled": "tags_pool",
        },
        {
            "name": "clicks",
            "table": "item_emb",
            "kind": "multi",
            "combiner": "sum",
            "weights": "clicks_w",
            "max_ids": L,
            "pooled": "clicks_pool",
        },
        {
            "name": "recent",
            "table": "item_emb",
            "kind": "multi",
            "combiner": "mean",
            "weights": "recent_w",
            "max_ids": L,
            "pooled": "recent_pool",
        },
    ],
    "dense": [{"name": "price", "dim": 1}, {"name": "ctx", "dim": 3}],
    "tables": {"item_emb": {"default_value": 0.25}},
}


@dataclass
class Tiny:
    model: Any
    declaration: Any
    instances: list[dict[str, Any]]
    keras_inputs: dict[str, np.ndarray]
    export: Any  # ExportResult


def build_tiny_model(seed: int = 0) -> Any:
    import keras

    from embedgate.export.layers import EmbeddingPooling

    keras.utils.set_random_seed(seed)
    init = keras.initializers.RandomNormal(stddev=1.0, seed=seed)
    user = keras.Input((), dtype="int64", name="user")
    genres = keras.Input((L,), dtype="int64", name="genres")
    genres_mask = keras.Input((L,), name="genres_mask")
    tags = keras.Input((L,), dtype="int64", name="tags")
    tags_w = keras.Input((L,), name="tags_w")
    clicks = keras.Input((L,), dtype="int64", name="clicks")
    clicks_w = keras.Input((L,), name="clicks_w")
    recent = keras.Input((L,), dtype="int64", name="recent")
    recent_w = keras.Input((L,), name="recent_w")
    price = keras.Input((1,), name="price")
    ctx = keras.Input((3,), name="ctx")
    user_emb = keras.layers.Embedding(300, 8, embeddings_initializer=init, name="user_emb")
    tag_emb = keras.layers.Embedding(120, 4, embeddings_initializer=init, name="tag_emb")
    item_emb = keras.layers.Embedding(500, 6, embeddings_initializer=init, name="item_emb")
    u = keras.layers.Identity(name="user_vec")(user_emb(user))
    g = EmbeddingPooling("mean", name="genres_pool")([tag_emb(genres), genres_mask])
    t = EmbeddingPooling("sqrtn", name="tags_pool")([tag_emb(tags), tags_w])
    c = EmbeddingPooling("sum", name="clicks_pool")([item_emb(clicks), clicks_w])
    r = EmbeddingPooling("mean", name="recent_pool")([item_emb(recent), recent_w])
    x = keras.layers.Concatenate()([u, g, t, c, r, price, ctx])
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=init)(x)
    ctr = keras.layers.Dense(1, activation="sigmoid", name="ctr")(h)
    score = keras.layers.Dense(2, name="score")(h)
    inputs = [user, genres, genres_mask, tags, tags_w, clicks, clicks_w, recent, recent_w, price, ctx]
    return keras.Model(inputs, [ctr, score], name="tiny")


def tiny_instances(seed: int = 1) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(12):
        n = [0, 1, 3, L][i % 4]
        inst: dict[str, Any] = {
            "user": int(rng.integers(0, 300)),
            "genres": rng.integers(0, 120, n).tolist(),
            "tags": rng.integers(0, 120, n).tolist(),
            "tags_w": rng.uniform(0.1, 2.0, n).round(3).tolist(),
            "clicks": rng.integers(0, 500, (n + 1) % (L + 1)).tolist(),
            "recent": rng.integers(0, 500, 2).tolist(),
            "recent_w": [0.0, 0.0] if i == 5 else [0.5, 1.5],  # all-zero weights: mean is a zero row
            "price": [float(rng.uniform())],
            "ctx": rng.normal(size=3).round(3).tolist(),
        }
        inst["clicks_w"] = [1.0] * len(inst["clicks"])
        if i == 3:
            del inst["tags_w"]  # weights optional: default all 1
        out.append(inst)
    out[0]["user"] = 299
    return out


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from embedgate.export.instances import to_keras_inputs

    model = build_tiny_model()
    decl = Declaration.model_validate(DECLARATION)
    instances = tiny_instances()
    inputs = to_keras_inputs(instances, decl, {t.name: tuple(t.shape) for t in model.inputs})
    result = export_model(model, decl, tmp_path_factory.mktemp("tiny"), num_shards=3)
    return Tiny(model, decl, instances, inputs, result)


@pytest.fixture(scope="session")
def tiny_pooled(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model exported with the pooled entry (``entry_input="pooled"``): its ExportResult."""
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model

    decl = Declaration.model_validate(DECLARATION)
    out = tmp_path_factory.mktemp("tiny_pooled")
    return export_model(build_tiny_model(), decl, out, num_shards=3, entry_input="pooled")


@pytest.fixture(scope="session")
def tiny_tf1(tiny: Tiny) -> Iterator[Any]:
    from tests.export.tf1 import Tf1Artifacts

    arts = Tf1Artifacts(tiny.export.model_dir, tiny.export.manifest)
    yield arts
    arts.close()


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path / "out"
