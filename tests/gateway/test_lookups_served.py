"""Lookup features end to end with real parts: a standard Keras two-tower model with ``StringLookup`` and
``IntegerLookup`` layers is exported, served by serve-local (entry + 2 PS shards) behind a real ``embedgate gateway``
process; clients send the raw strings and ids over REST (row JSON, columnar JSON, base64 tf.Example) and gRPC
(DT_STRING / int64 tensors). Predictions equal the Keras model's, out-of-vocabulary values included."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from schemas.manifest import Manifest
from tests.export.test_standard_models import GENRES, MOVIES, TWO_TOWER_DECL, USERS, _two_tower
from tests.support.predict import example_b64, post_predict, predictions

pytestmark = pytest.mark.integration

_MODEL = "twotower"


@dataclass
class Served:
    url: str
    channel: grpc.Channel
    manifest: Manifest
    instances: list[dict[str, Any]]
    want: np.ndarray  # the Keras model's ctr for ``instances``
    model_dir: Path


def _instances() -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    out = []
    for k in range(10):
        n = 1 + k % 4
        genres = [GENRES[int(i)] for i in rng.integers(0, len(GENRES), 1 + k % 3)]
        out.append(
            {
                "user_id": ([*USERS, "zed"])[k % 5],  # "zed": out of vocabulary -> the OOV row, as in Keras
                "movie_id": ([*MOVIES, 99])[k % 6],  # 99: out of vocabulary
                "history": rng.integers(1, 60, 1 + k % 7).tolist(),
                "tags": rng.integers(0, 30, n).tolist(),
                "tags_w": rng.uniform(0.1, 2.0, n).round(3).tolist(),
                "age": [float(rng.uniform(0, 1))],
                "genres": [*genres, "opera", "日本"] if k % 4 == 1 else genres,  # OOV strings in a list
            }
        )
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from embedgate.export.instances import to_keras_inputs
    from tests.support.gateway import serve_exported

    tmp = tmp_path_factory.mktemp("lookups")
    model = _two_tower()
    decl = Declaration.model_validate(TWO_TOWER_DECL)
    result = export_model(model, decl, tmp / "out", num_shards=2)
    manifest = result.manifest
    instances = _instances()
    shapes = {t.name: tuple(t.shape) for t in model.inputs}
    want = np.asarray(model(to_keras_inputs(instances, decl, shapes, {"genres": ""}), training=False))
    want = want.reshape(len(instances))
    assert np.ptp(want) > 1e-3  # the examples differ: comparisons are not vacuous

    md = result.model_dir
    with serve_exported(md, tmp) as (gw, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Served(gw.url, channel, manifest, instances, want, md)


def _post(s: Served, body: dict[str, Any]) -> httpx.Response:
    return post_predict(s.url, _MODEL, body, timeout=30)


def _ctr(r: httpx.Response) -> np.ndarray:
    return predictions(r, output="ctr")


def test_rest_rows_of_raw_strings_and_ids_equal_keras(served: Served) -> None:
    got = _ctr(_post(served, {"instances": served.instances}))
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def test_rest_columns_equal_keras(served: Served) -> None:
    inputs = {name: [inst[name] for inst in served.instances] for name in served.instances[0]}
    r = _post(served, {"inputs": inputs})
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["outputs"], np.float32).reshape(-1)
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def test_rest_base64_examples_with_bytes_lists_equal_keras(served: Served) -> None:
    # "label": not read by the model, so ignored, as TF's parsing does
    labelled = [{**inst, "label": 1.0} for inst in served.instances]
    body = {"instances": [{"b64": example_b64(inst)} for inst in labelled]}
    got = _ctr(_post(served, body))
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def _tensors(instances: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client with the official API sends: DT_STRING for string features (multi padded with b""), int64 ids
    for the integer lookup, -1 padding for plain multi ids."""
    import tensorflow as tf

    b = len(instances)
    width = max(1, *(len(i["genres"]) for i in instances))
    genres = np.full((b, width), b"", dtype=object)
    for r, inst in enumerate(instances):
        genres[r, : len(inst["genres"])] = [g.encode() for g in inst["genres"]]
    out = {
        "user_id": tf.make_tensor_proto(np.array([i["user_id"].encode() for i in instances], dtype=object)),
        "movie_id": tf.make_tensor_proto(np.array([i["movie_id"] for i in instances], np.int64)),
        "genres": tf.make_tensor_proto(genres),
        "age": tf.make_tensor_proto(np.array([i["age"] for i in instances], np.float32)),
    }
    for name, weights in (("history", None), ("tags", "tags_w")):
        width = max(len(i[name]) for i in instances)
        ids = np.full((b, width), -1, np.int64)
        w = np.zeros((b, width), np.float32)
        for r, inst in enumerate(instances):
            ids[r, : len(inst[name])] = inst[name]
            if weights:
                w[r, : len(inst[name])] = inst[weights]
        out[name] = tf.make_tensor_proto(ids)
        if weights:
            out[weights] = tf.make_tensor_proto(w)
    return out


def _grpc_predict(s: Served, tensors: dict[str, Any]) -> Any:
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    req = predict_pb2.PredictRequest()
    req.model_spec.name = _MODEL
    for k, t in tensors.items():
        req.inputs[k].CopyFrom(t)
    return prediction_service_pb2_grpc.PredictionServiceStub(s.channel).Predict(req, timeout=30)


def test_grpc_string_tensors_equal_keras(served: Served) -> None:
    import tensorflow as tf

    resp = _grpc_predict(served, _tensors(served.instances))
    got = np.asarray(tf.make_ndarray(resp.outputs["ctr"]), np.float32).reshape(-1)
    np.testing.assert_allclose(got, served.want, rtol=1e-5, atol=1e-6)


def test_out_of_vocabulary_values_share_the_oov_row(served: Served) -> None:
    """Two unknown users (and movies) predict exactly alike: both read the OOV row."""
    a = dict(served.instances[0], user_id="nobody", movie_id=12345)
    b = dict(a, user_id="somebody else", movie_id=-7)
    known = dict(a, user_id="bob", movie_id=20)
    got = _ctr(_post(served, {"instances": [a, b, known]}))
    assert got[0] == got[1]
    assert got[0] != got[2]


def test_a_lone_surrogate_is_a_400_naming_it(served: Served) -> None:
    """JSON allows "\\ud800" but it is no text (not encodable as UTF-8): the gateway refuses the body (400 naming
    the surrogate, docs/security.md) before any lookup, never a server error."""
    rows = [dict(served.instances[0], user_id="@")]
    body = json.dumps({"instances": rows}).replace('"@"', '"\\ud800"')
    r = httpx.post(f"{served.url}/v1/models/{_MODEL}:predict", content=body, timeout=30)
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["error"]


def test_metadata_types_string_features_as_strings(served: Served) -> None:
    r = httpx.get(f"{served.url}/v1/models/{_MODEL}/metadata", timeout=30)
    assert r.status_code == 200, r.text
    inputs = r.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs["user_id"]["dtype"] == "DT_STRING"
    assert inputs["genres"]["dtype"] == "DT_STRING"
    assert inputs["movie_id"]["dtype"] == "DT_INT64"


@pytest.mark.parametrize(
    ("change", "example", "message"),
    [
        ({"user_id": 3}, 1, "feature 'user_id' at example 1: expected one string"),
        ({"genres": ["drama", 4]}, 1, "feature 'genres' at example 1: expected a list of strings"),
        ({"movie_id": "10"}, 1, "feature 'movie_id' at example 1: expected one int64 id"),
        ({"genres": "drama"}, 1, "feature 'genres' at example 1: expected a list of strings"),
    ],
)
def test_rest_wrong_value_types_are_400_naming_feature_and_example(
    served: Served, change: dict[str, Any], example: int, message: str
) -> None:
    instances = [served.instances[0], dict(served.instances[1], **change)]
    r = _post(served, {"instances": instances})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_rest_example_with_int64_list_for_a_string_feature_is_400(served: Served) -> None:
    from schemas.proto import tfs_pb2

    ex = tfs_pb2.Example.FromString(base64.b64decode(example_b64(served.instances[0])))
    ex.features.feature["user_id"].int64_list.value.append(3)
    body = {
        "instances": [
            {"b64": example_b64(served.instances[0])},
            {"b64": base64.b64encode(ex.SerializeToString()).decode()},
        ]
    }
    r = _post(served, body)
    assert r.status_code == 400, r.text
    assert "feature 'user_id' at example 1: expected a bytes_list of strings" in r.json()["error"]


def test_grpc_int_tensor_for_a_string_feature_is_invalid_argument(served: Served) -> None:
    import tensorflow as tf

    tensors = _tensors(served.instances)
    tensors["user_id"] = tf.make_tensor_proto(np.arange(len(served.instances), dtype=np.int64))
    with pytest.raises(grpc.RpcError) as exc:
        _grpc_predict(served, tensors)
    assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "feature 'user_id': expected a string tensor" in exc.value.details()  # type: ignore[attr-defined]
    tensors = _tensors(served.instances)
    tensors["movie_id"] = tf.make_tensor_proto(np.array([b"10"] * len(served.instances), dtype=object))
    with pytest.raises(grpc.RpcError) as exc:
        _grpc_predict(served, tensors)
    assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "feature 'movie_id': expected int64" in exc.value.details()  # type: ignore[attr-defined]


def test_openapi_types_string_features_as_strings_and_its_examples_predict(served: Served) -> None:
    r = httpx.get(f"{served.url}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    doc = r.json()
    instance = doc["components"]["schemas"][f"{_MODEL}.Instance"]["properties"]
    assert instance["user_id"]["anyOf"][0] == {"type": "string"}
    assert instance["genres"]["items"] == {"type": "string"}
    assert instance["movie_id"]["anyOf"][0]["type"] == "integer"
    assert "movie_lookup" in instance["movie_id"]["description"]
    op = doc["paths"][f"/v1/models/{_MODEL}:predict"]["post"]
    for example in op["requestBody"]["content"]["application/json"]["examples"].values():
        body = example["value"]
        assert _post(served, body).status_code == 200, body
        rows = body.get("instances") or [
            dict(zip(body["inputs"], v, strict=False)) for v in zip(*body["inputs"].values(), strict=False)
        ]
        assert all(isinstance(row["user_id"], str) for row in rows if "b64" not in row)


def test_the_exporters_example_request_sends_raw_vocabulary_values(served: Served) -> None:
    body = json.loads((served.model_dir / "example_request.json").read_text())
    for row in body["instances"]:
        assert isinstance(row["user_id"], str) and not row["user_id"].startswith("<embedgate")
        assert all(isinstance(g, str) for g in row["genres"])
    assert np.all(np.isfinite(_ctr(_post(served, body))))
