"""Entry input modes end to end with real parts: one Keras model (tests/gateway/entry_modes_model.py: a StringLookup,
a Hashing feature, ``mask_zero`` histories padded with 0 under every combiner, a weighted sqrtn feature) exported
three times: with the ``pooled`` entry, with the ``unique_rows`` entry (float32 rows), and with ``unique_rows`` and
bfloat16 rows. serve-local serves all three behind one real gateway. Every request form (REST rows, REST columns,
base64 tf.Example, gRPC tensors) gives the ``unique_rows`` predictions equal to the ``pooled`` ones within 1e-6 and
both equal to Keras; bfloat16 within the tolerance docs/export.md states. Padded histories are pooled without their
padding on every path (issue 17 item 0: ``[5, 9, 13, 0, ...]`` averaged row 0 in)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tests.gateway.entry_modes_model import (
    HIST_LEN,
    TAGS_LEN,
    build_model,
    declaration,
    instances,
    keras_predictions,
)
from tests.support.predict import Kind, example_b64, post_predict, predictions

pytestmark = pytest.mark.integration

MODES = {
    "modes_pooled": ("pooled", "float32"),
    "modes_unique": ("unique_rows", "float32"),
    "modes_bf16": ("unique_rows", "bfloat16"),
}
_EMPTY_TAGS: dict[str, Kind] = {"tags": "int64", "tags_w": "float"}  # tags may be []
BF16_TOLERANCE = 1e-2  # docs/export.md "Rows in reduced precision": absolute, on a sigmoid output


@dataclass
class Served:
    url: str
    channel: grpc.Channel
    instances: list[dict[str, Any]]
    want: np.ndarray
    max_errors: dict[str, float | None]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import yaml

    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from tests.support.gateway import run_gateway
    from tests.support.ports import free_port
    from tests.support.servers import serve_local
    from tests.support.stack import embedding_model, exported_backends

    tmp = tmp_path_factory.mktemp("modes")
    model = build_model()
    insts = instances()
    want = keras_predictions(model, insts)
    assert np.ptp(want) > 1e-3  # the examples differ: comparisons are not vacuous
    dirs: dict[str, Path] = {}
    errors: dict[str, float | None] = {}
    for name, (mode, dtype) in MODES.items():
        r = export_model(
            model,
            Declaration.model_validate(declaration(name)),
            tmp / "out",
            entry_input=mode,
            entry_row_dtype=dtype,
            # the unique_rows exports' self-checks are asserted below; the pooled one is checked served, against
            # Keras, by every test here
            self_check=mode != "pooled",
        )
        assert r.manifest.entry.input_mode == mode and r.manifest.entry.row_dtype == dtype
        dirs[name], errors[name] = r.model_dir, r.max_error
    backends: dict[str, Path] = {}
    for d in dirs.values():
        backends.update(exported_backends(d))
    with serve_local(backends) as server:
        models = [
            embedding_model(d, entry=server.target, shards=[[server.target]] * 2) for d in dirs.values()
        ]
        cfg = tmp / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": models}))
        port = free_port()
        with (
            run_gateway(cfg, env={"EMBEDGATE_GRPC_PORT": str(port)}) as gw,
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            yield Served(gw.url, channel, insts, want, errors)


def _post(s: Served, model: str, body: dict[str, Any]) -> np.ndarray:
    return predictions(post_predict(s.url, model, body))


def _check(s: Served, got: dict[str, np.ndarray]) -> None:
    """unique_rows == pooled within 1e-6; both == Keras; bfloat16 rows within BF16_TOLERANCE of Keras."""
    np.testing.assert_allclose(got["modes_unique"], got["modes_pooled"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["modes_pooled"], s.want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["modes_unique"], s.want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["modes_bf16"], s.want, rtol=0, atol=BF16_TOLERANCE)


def test_export_reports_its_largest_error(served: Served) -> None:
    assert served.max_errors["modes_unique"] is not None and served.max_errors["modes_unique"] < 1e-5
    bf16 = served.max_errors["modes_bf16"]
    assert bf16 is not None and 0 < bf16 < BF16_TOLERANCE  # reduced precision shows, within the tolerance


def test_rest_rows_equal_keras_in_every_mode(served: Served) -> None:
    got = {m: _post(served, m, {"instances": served.instances}) for m in MODES}
    _check(served, got)


def test_issue_17_padded_history_is_pooled_without_its_padding(served: Served) -> None:
    """``"hist_mean": [5, 9, 13, 0, 0, 0, 0, 0, 0, 0]`` is served as Keras computes it, alone and unpadded alike."""
    inst = served.instances[0]
    assert inst["hist_mean"] == [5, 9, 13, 0, 0, 0, 0, 0, 0, 0]
    unpadded = {**inst, "hist_mean": [5, 9, 13]}
    for m in MODES:
        padded_pred = _post(served, m, {"instances": [inst]})
        atol = BF16_TOLERANCE if m == "modes_bf16" else 1e-6
        np.testing.assert_allclose(padded_pred, served.want[:1], rtol=1e-5, atol=atol)
        np.testing.assert_allclose(
            _post(served, m, {"instances": [unpadded]}), padded_pred, rtol=0, atol=1e-7
        )


def test_rest_columns_equal_keras_in_every_mode(served: Served) -> None:
    names = list(served.instances[0])
    body = {"inputs": {n: [inst[n] for inst in served.instances] for n in names}}
    _check(served, {m: _post(served, m, body) for m in MODES})


def test_rest_base64_examples_equal_keras_in_every_mode(served: Served) -> None:
    body = {"instances": [{"b64": example_b64(inst, _EMPTY_TAGS)} for inst in served.instances]}
    _check(served, {m: _post(served, m, body) for m in MODES})


def _grpc_request(insts: list[dict[str, Any]], model: str) -> Any:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    b = len(insts)
    words_len = max(len(i["words"]) for i in insts)
    words = np.full((b, words_len), b"", dtype=object)
    for r, inst in enumerate(insts):
        words[r, : len(inst["words"])] = [w.encode() for w in inst["words"]]
    tensors: dict[str, np.ndarray] = {
        "user": np.array([i["user"].encode() for i in insts], dtype=object),
        "item": np.array([i["item"] for i in insts], np.int64),
        "words": words,
        "x": np.array([i["x"] for i in insts], np.float32),
    }
    for c in ("mean", "sum", "sqrtn", "wmean"):
        arr = np.zeros((b, HIST_LEN), np.int64)  # padded with 0 as Keras input is: the gateway drops it
        for r, inst in enumerate(insts):
            arr[r, : len(inst[f"hist_{c}"])] = inst[f"hist_{c}"]
        tensors[f"hist_{c}"] = arr
    hw = np.zeros((b, HIST_LEN), np.float32)
    tags = np.full((b, TAGS_LEN), -1, np.int64)  # -1: the gRPC front's padding of an id list
    tw = np.zeros((b, TAGS_LEN), np.float32)
    for r, inst in enumerate(insts):
        hw[r, : len(inst["hist_wmean_w"])] = inst["hist_wmean_w"]
        tags[r, : len(inst["tags"])] = inst["tags"]
        tw[r, : len(inst["tags_w"])] = inst["tags_w"]
    tensors.update({"hist_wmean_w": hw, "tags": tags, "tags_w": tw})
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    for k, v in tensors.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    return req


def test_grpc_tensors_equal_keras_in_every_mode(served: Served) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(served.channel)
    got = {}
    for m in MODES:
        resp = stub.Predict(_grpc_request(served.instances, m), timeout=60)
        got[m] = np.asarray(tf.make_ndarray(resp.outputs["ctr"]), np.float64).reshape(-1)
    _check(served, got)


def test_one_user_batch_repeats_rows_and_still_equals_pooled(served: Served) -> None:
    """A ranking-style batch (one user's features in every example, distinct candidates): the unique-rows request
    carries each row once and predicts what the pooled entry predicts."""
    base = served.instances[2]
    batch = [{**base, "item": k % 50, "x": [k / 64, 0.5, -0.5]} for k in range(64)]
    got = {m: _post(served, m, {"instances": batch}) for m in MODES}
    np.testing.assert_allclose(got["modes_unique"], got["modes_pooled"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["modes_bf16"], got["modes_pooled"], rtol=0, atol=BF16_TOLERANCE)
    assert np.ptp(got["modes_pooled"]) > 1e-4
