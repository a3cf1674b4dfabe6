"""Keras ``Hashing`` in front of an Embedding, end to end with real parts: a model hashing a string feature and an
integer feature (with ``mask_value``) is exported (table keyed by bin, a ``hashing`` mapping in ``lookups.json``),
served by serve-local (entry + 2 PS shards) behind a real ``embedgate gateway`` process; clients send the raw strings
and integers over REST (row JSON, columnar JSON, base64 tf.Example). The gateway computes the bins without TensorFlow
(gateway/farmhash.py); predictions equal the Keras model's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from gateway.lookup_mapping import HashInput, LookupKind, load_lookups
from schemas.manifest import Manifest
from tests.support.predict import example_b64, post_predict, predictions

pytestmark = pytest.mark.integration

_MODEL = "hashed"
TAG_BINS = 64
ITEM_BINS = 40
WORD_BINS = 30

DECL = {
    "model_name": _MODEL,
    "sparse": [
        {"name": "tag", "table": "tag_emb", "pooled": "tag_vec"},
        {"name": "item", "table": "item_emb", "pooled": "item_vec"},
        {"name": "words", "table": "word_emb", "kind": "multi", "combiner": "mean", "pooled": "words_vec"},
    ],
    "dense": [{"name": "x", "dim": 2}],
}


def hashing_model() -> Any:
    import keras

    keras.utils.set_random_seed(5)
    init = keras.initializers.RandomNormal(stddev=0.5, seed=3)
    tag = keras.Input((), dtype="string", name="tag")
    item = keras.Input((), dtype="int64", name="item")
    x = keras.Input((2,), name="x")
    words = keras.Input((None,), dtype="string", name="words")  # padded with the mask value ""
    t_bin = keras.layers.Hashing(TAG_BINS, name="tag_hash")(tag)
    i_bin = keras.layers.Hashing(ITEM_BINS, mask_value=0, name="item_hash")(item)
    t = keras.layers.Identity(name="tag_vec")(
        keras.layers.Embedding(TAG_BINS, 6, embeddings_initializer=init, name="tag_emb")(t_bin)
    )
    i = keras.layers.Identity(name="item_vec")(
        keras.layers.Embedding(ITEM_BINS, 6, embeddings_initializer=init, name="item_emb")(i_bin)
    )
    w_bin = keras.layers.Hashing(WORD_BINS, mask_value="", name="word_hash")(words)
    w_rows = keras.layers.Embedding(
        WORD_BINS, 6, mask_zero=True, embeddings_initializer=init, name="word_emb"
    )(w_bin)
    w = keras.layers.GlobalAveragePooling1D(name="words_vec")(w_rows)
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([t, i, w, x]))
    y = keras.layers.Dense(1, activation="sigmoid", name="ctr")(h)
    return keras.Model([tag, item, words, x], y, name="hashed")


def _instances() -> list[dict[str, Any]]:
    rng = np.random.default_rng(3)
    tags = ["", "a", "news", "sport" * 5, "日本語のタグ", "t" * 50, "long tag " * 12, "zzz"]
    items = [0, 1, 7, -3, 123456789, 2**40 + 1, 99, 0]
    vocab = ["red", "green", "blue", "a much longer word than sixteen bytes", "ü", "x" * 70]
    return [
        {
            "tag": tags[k % len(tags)],
            "item": items[(3 * k) % len(items)],
            "words": [vocab[int(j)] for j in rng.integers(0, len(vocab), 1 + k % 4)],
            "x": rng.uniform(-1, 1, 2).round(3).tolist(),
        }
        for k in range(16)
    ]


@dataclass
class Served:
    url: str
    channel: grpc.Channel
    instances: list[dict[str, Any]]
    want: np.ndarray
    model_dir: Path
    manifest: Manifest


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from tests.support.gateway import serve_exported

    tmp = tmp_path_factory.mktemp("hashing")
    model = hashing_model()
    result = export_model(model, Declaration.model_validate(DECL), tmp / "out", num_shards=2)
    manifest = result.manifest
    instances = _instances()
    width = max(len(inst["words"]) for inst in instances)
    feeds = {
        "words": np.array(
            [[*inst["words"], *[""] * (width - len(inst["words"]))] for inst in instances], dtype=object
        ),
        "tag": np.array([inst["tag"] for inst in instances], dtype=object),
        "item": np.array([inst["item"] for inst in instances], np.int64),
        "x": np.array([inst["x"] for inst in instances], np.float32),
    }
    want = np.asarray(model(feeds, training=False)).reshape(len(instances))
    assert np.ptp(want) > 1e-3  # the examples differ: comparisons are not vacuous
    md = result.model_dir
    with serve_exported(md, tmp) as (gw, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Served(gw.url, channel, instances, want, md, manifest)


def _post(s: Served, body: dict[str, Any]) -> httpx.Response:
    return post_predict(s.url, _MODEL, body, timeout=30)


def _ctr(r: httpx.Response) -> np.ndarray:
    return predictions(r, output="ctr")


def test_export_keys_the_tables_by_bin(served: Served) -> None:
    mappings = load_lookups(served.model_dir)
    tag, item = mappings["tag"], mappings["item"]
    assert (tag.kind, tag.num_bins, tag.hash_input, tag.mask_value) == (
        LookupKind.HASHING,
        TAG_BINS,
        HashInput.STRING,
        None,
    )
    assert (item.kind, item.num_bins, item.hash_input, item.mask_value) == (
        LookupKind.HASHING,
        ITEM_BINS,
        HashInput.INTEGER,
        0,
    )
    assert served.manifest.table("tag_emb").rows == TAG_BINS
    assert served.manifest.table("item_emb").rows == ITEM_BINS


def test_rest_rows_of_raw_strings_and_ints_equal_keras(served: Served) -> None:
    got = _ctr(_post(served, {"instances": served.instances}))
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def test_rest_columns_equal_keras(served: Served) -> None:
    inputs = {name: [inst[name] for inst in served.instances] for name in served.instances[0]}
    r = _post(served, {"inputs": inputs})
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["outputs"], np.float32).reshape(-1)
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def test_rest_base64_examples_equal_keras(served: Served) -> None:
    body = {"instances": [{"b64": example_b64(inst)} for inst in served.instances]}
    got = _ctr(_post(served, body))
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def test_wrong_value_types_are_client_errors(served: Served) -> None:
    inst = dict(served.instances[0])
    r = _post(served, {"instances": [{**inst, "tag": 5}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(
        "feature 'tag' at example 0: expected one string (the model maps this feature with a Hashing layer"
    )
    r = _post(served, {"instances": [{**inst, "item": "seven"}]})
    assert r.status_code == 400, r.text
    assert "item" in r.json()["error"]


def test_grpc_string_and_int64_tensors_equal_keras(served: Served) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    insts = served.instances
    width = max(len(i["words"]) for i in insts)
    words = np.full((len(insts), width), b"", dtype=object)  # b"": the padding of a string multi feature
    for r, inst in enumerate(insts):
        words[r, : len(inst["words"])] = [w.encode() for w in inst["words"]]
    req = predict_pb2.PredictRequest()
    req.model_spec.name = _MODEL
    tensors = {
        "tag": np.array([i["tag"].encode() for i in insts], dtype=object),
        "item": np.array([i["item"] for i in insts], np.int64),
        "words": words,
        "x": np.array([i["x"] for i in insts], np.float32),
    }
    for k, v in tensors.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    resp = prediction_service_pb2_grpc.PredictionServiceStub(served.channel).Predict(req, timeout=30)
    got = np.asarray(tf.make_ndarray(resp.outputs["ctr"]), np.float32).reshape(-1)
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def test_metadata_types_hashed_string_features_as_strings(served: Served) -> None:
    r = httpx.get(f"{served.url}/v1/models/{_MODEL}/metadata", timeout=30)
    assert r.status_code == 200, r.text
    inputs = r.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs["tag"]["dtype"] == "DT_STRING"
    assert inputs["words"]["dtype"] == "DT_STRING"
    assert inputs["item"]["dtype"] == "DT_INT64"


def test_openapi_types_hashed_string_features_as_strings_and_its_examples_predict(served: Served) -> None:
    r = httpx.get(f"{served.url}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    instance = doc["components"]["schemas"][f"{_MODEL}.Instance"]["properties"]
    assert instance["tag"]["anyOf"][0] == {"type": "string"}
    assert instance["words"]["items"] == {"type": "string"}
    assert instance["item"]["anyOf"][0]["type"] == "integer"
    assert f"{ITEM_BINS} hash bins" in instance["item"]["description"]
    op = doc["paths"][f"/v1/models/{_MODEL}:predict"]["post"]
    for example in op["requestBody"]["content"]["application/json"]["examples"].values():
        assert _post(served, example["value"]).status_code == 200, example["value"]


def test_the_exporters_example_request_predicts(served: Served) -> None:
    body = json.loads((served.model_dir / "example_request.json").read_text())
    assert all(isinstance(row["tag"], str) for row in body["instances"])
    assert np.all(np.isfinite(_ctr(_post(served, body))))
