"""The gateway's gRPC front end to end: a real `embedgate gateway` process (grpc_port set) over real serve-local
backends, called with the official ``tensorflow-serving-api`` stubs and the standard gRPC health stub."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml

from gateway import native
from tests.gateway.conftest import passthrough_models
from tests.support.gateway import run_gateway
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

_TIMEOUT = 30.0
# One request at a time (every test calls sequentially; the overload test relies on it); 4 MiB request messages.
_LIMITS = {"EMBEDGATE_MAX_IN_FLIGHT": "1", "EMBEDGATE_MAX_BODY_BYTES": str(4 * 1024 * 1024)}


class Front:
    def __init__(self, url: str, channel: grpc.Channel) -> None:
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self.url = url
        self.channel = channel
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(channel)


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory,
    demo_artifacts: Any,
    demo_backends: Any,
    passthrough_backend: Any,
) -> Iterator[Front]:
    m = demo_artifacts.manifest
    embedding = {
        "kind": "embedding",
        "name": m.model_name,
        "manifest": str(demo_artifacts.model_dir),
        "entry": demo_backends.target,
        "shards": [{"replicas": [demo_backends.target]}] * m.num_shards,
        "version_labels": {"stable": m.version},
    }
    cfg = tmp_path_factory.mktemp("grpc_front") / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"models": [embedding, *passthrough_models(passthrough_backend.target)]}))
    port = free_port()
    with (
        run_gateway(cfg, env={"EMBEDGATE_GRPC_PORT": str(port), **_LIMITS}) as gw,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield Front(gw.url, channel)


def _tensors(instances: list[dict[str, Any]], manifest: Any) -> dict[str, Any]:
    """The instances as gRPC tensors: single ids [B], multi ids [B, L] padded with -1 plus weights [B, L], dense
    [B, dim] (tf.make_tensor_proto, as a client with the official API would build them)."""
    import tensorflow as tf

    out: dict[str, Any] = {}
    for f in manifest.sparse_features:
        if f.kind.value == "single":
            out[f.name] = tf.make_tensor_proto(np.array([i[f.name] for i in instances], dtype=np.int64))
            continue
        width = max(1, *(len(i[f.name]) for i in instances))
        ids = np.full((len(instances), width), -1, dtype=np.int64)
        weights = np.zeros((len(instances), width), dtype=np.float32)
        for r, inst in enumerate(instances):
            ids[r, : len(inst[f.name])] = inst[f.name]
            weights[r, : len(inst[f.name])] = inst.get(f.weights or "", [1.0] * len(inst[f.name]))
        out[f.name] = tf.make_tensor_proto(ids)
        if f.weights:
            out[f.weights] = tf.make_tensor_proto(weights)
    for d in manifest.dense_features:
        rows = [i[d.name] if isinstance(i[d.name], list) else [i[d.name]] for i in instances]
        out[d.name] = tf.make_tensor_proto(np.array(rows, dtype=np.float32).reshape(len(instances), d.dim))
    return out


def _predict_request(model: str, tensors: dict[str, Any], **spec: Any) -> Any:
    from tensorflow_serving.apis import predict_pb2

    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    for k, v in spec.items():
        if k == "version":
            req.model_spec.version.value = v
        else:
            setattr(req.model_spec, k, v)
    for k, t in tensors.items():
        req.inputs[k].CopyFrom(t)
    return req


def _only_output(resp: Any) -> np.ndarray:
    import tensorflow as tf

    assert len(resp.outputs) == 1, list(resp.outputs)
    (t,) = resp.outputs.values()
    return np.asarray(tf.make_ndarray(t), dtype=np.float32)


def _rest_predictions(front: Front, model: str, instances: list[dict[str, Any]]) -> np.ndarray:
    r = httpx.post(
        f"{front.url}/v1/models/{model}:predict", content=json.dumps({"instances": instances}), timeout=30
    )
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["predictions"], dtype=np.float32)


def _code(exc: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    return exc.value.code()  # type: ignore[attr-defined,no-any-return]


def _details(exc: pytest.ExceptionInfo[grpc.RpcError]) -> str:
    return exc.value.details()  # type: ignore[attr-defined,no-any-return]


def test_embedding_predict_equals_rest_and_keras(front: Front, demo_artifacts: Any) -> None:
    import keras

    m = demo_artifacts.manifest
    instances = demo_artifacts.instances
    tensors = _tensors(instances, m)
    resp = front.predictions.Predict(_predict_request(m.model_name, tensors), _TIMEOUT)
    got = _only_output(resp)
    rest = _rest_predictions(front, m.model_name, instances)
    np.testing.assert_array_equal(got.reshape(rest.shape), rest)
    assert resp.model_spec.name == m.model_name and resp.model_spec.version.value == m.version
    assert resp.model_spec.signature_name == "serving_default"

    model = keras.models.load_model(demo_artifacts.keras_path)
    want = model.predict(demo_artifacts.keras_inputs(instances), verbose=0)
    if isinstance(want, dict):
        (want,) = want.values()
    np.testing.assert_allclose(
        got.reshape(np.shape(want)), np.asarray(want, np.float32), rtol=1e-4, atol=1e-5
    )

    for spec in ({"version": m.version}, {"version_label": "stable"}, {"signature_name": "serving_default"}):
        again = front.predictions.Predict(_predict_request(m.model_name, tensors, **spec), _TIMEOUT)
        np.testing.assert_array_equal(_only_output(again), got)


def test_embedding_reply_is_the_entrys_answer_relayed(front: Front, demo_artifacts: Any) -> None:
    """A Predict of an embedding model that had the entry call to itself (no output_filter) is answered with the
    entry's serialized reply and the client's ModelSpec appended, as a pass-through model's is: the tensors are the
    entry's bytes, never decoded and encoded again. With output_filter the reply is built; both carry the same
    tensor bytes and read as the same ModelSpec."""
    from google.protobuf import empty_pb2
    from google.protobuf.unknown_fields import UnknownFieldSet
    from tensorflow_serving.apis import predict_pb2

    def call(req: Any) -> tuple[Any, list[int]]:
        raw = front.channel.unary_unary("/tensorflow.serving.PredictionService/Predict")(
            req.SerializeToString(), timeout=_TIMEOUT
        )
        fields = [f.field_number for f in UnknownFieldSet(empty_pb2.Empty.FromString(raw))]
        return predict_pb2.PredictResponse.FromString(raw), fields

    m = demo_artifacts.manifest
    req = _predict_request(m.model_name, _tensors(demo_artifacts.instances, m))
    relayed, fields = call(req)
    assert fields.count(2) == 2, fields  # model_spec twice: the entry's, then the client's name and signature
    spec = relayed.model_spec
    assert (spec.name, spec.version.value) == (m.model_name, m.version)
    assert spec.signature_name == "serving_default"
    (name,) = relayed.outputs
    req.output_filter.append(name)
    built, fields = call(req)
    assert fields.count(2) == 1, fields
    assert built.model_spec == relayed.model_spec
    assert built.outputs[name].SerializeToString() == relayed.outputs[name].SerializeToString()


def test_embedding_ragged_padding_and_weights(front: Front, demo_artifacts: Any) -> None:
    """-1 pads a multi feature; a wider padding, and weights at padded positions, change nothing."""
    import tensorflow as tf

    m = demo_artifacts.manifest
    instances = demo_artifacts.instances[:3]
    base = _only_output(
        front.predictions.Predict(_predict_request(m.model_name, _tensors(instances, m)), _TIMEOUT)
    )
    tensors = _tensors(instances, m)
    for f in m.sparse_features:
        if f.kind.value != "multi":
            continue
        ids = tf.make_ndarray(tensors[f.name])
        tensors[f.name] = tf.make_tensor_proto(np.pad(ids, ((0, 0), (0, 3)), constant_values=-1))
        if f.weights:
            w = tf.make_ndarray(tensors[f.weights])
            tensors[f.weights] = tf.make_tensor_proto(np.pad(w, ((0, 0), (0, 3)), constant_values=7.0))
    wide = _only_output(front.predictions.Predict(_predict_request(m.model_name, tensors), _TIMEOUT))
    np.testing.assert_array_equal(wide, base)


def test_embedding_bad_features_are_invalid_argument(front: Front, demo_artifacts: Any) -> None:
    import tensorflow as tf

    m = demo_artifacts.manifest
    good = _tensors(demo_artifacts.instances[:2], m)
    multi = next(f for f in m.sparse_features if f.kind.value == "multi")
    dense = m.dense_features[-1]
    cases = {
        multi.name: {**good, multi.name: tf.make_tensor_proto(np.array([[0.5], [1.5]], dtype=np.float32))},
        dense.name: {
            **good,
            dense.name: tf.make_tensor_proto(np.zeros((2, dense.dim + 1), dtype=np.float32)),
        },
        "nope": {**good, "nope": tf.make_tensor_proto(np.array([1, 2], dtype=np.int64))},
        m.sparse_features[0].name: {k: v for k, v in good.items() if k != m.sparse_features[0].name},
    }
    for feature, tensors in cases.items():
        with pytest.raises(grpc.RpcError) as exc:
            front.predictions.Predict(_predict_request(m.model_name, tensors), _TIMEOUT)
        assert _code(exc) == grpc.StatusCode.INVALID_ARGUMENT, _details(exc)
        assert repr(feature) in _details(exc), _details(exc)


def test_embedding_metadata_and_status(front: Front, demo_artifacts: Any) -> None:
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2

    m = demo_artifacts.manifest
    req = get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec=model_pb2.ModelSpec(name=m.model_name), metadata_field=["signature_def"]
    )
    resp = front.predictions.GetModelMetadata(req, _TIMEOUT)
    sigmap = get_model_metadata_pb2.SignatureDefMap()
    assert resp.metadata["signature_def"].Unpack(sigmap)  # type URL names tensorflow.serving.SignatureDefMap
    assert list(sigmap.signature_def) == ["serving_default"]
    inputs = set(sigmap.signature_def["serving_default"].inputs)
    assert {f.name for f in m.sparse_features} <= inputs and {d.name for d in m.dense_features} <= inputs
    assert resp.model_spec.name == m.model_name and resp.model_spec.version.value == m.version
    status = front.models.GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec=model_pb2.ModelSpec(name=m.model_name)),
        _TIMEOUT,
    )
    assert [s.version for s in status.model_version_status] == [m.version]
    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    with pytest.raises(grpc.RpcError) as exc:
        front.predictions.GetModelMetadata(
            get_model_metadata_pb2.GetModelMetadataRequest(model_spec=model_pb2.ModelSpec(name=m.model_name)),
            _TIMEOUT,
        )
    assert _code(exc) == grpc.StatusCode.INVALID_ARGUMENT and "metadata_field" in _details(exc)


def test_ps_servables_and_signatures_are_not_found(front: Front, demo_artifacts: Any) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2

    m = demo_artifacts.manifest
    ids = {f"{t.name}_ids": tf.make_tensor_proto(np.array([1], dtype=np.int64)) for t in m.tables}
    hidden_names = [f"{m.model_name}_ps_{i}" for i in range(m.num_shards)] + [f"{m.model_name}_entry"]
    for name in hidden_names:
        calls = [
            lambda n=name: front.predictions.Predict(
                _predict_request(n, ids, signature_name="lookup"), _TIMEOUT
            ),
            lambda n=name: front.predictions.Predict(_predict_request(n, ids), _TIMEOUT),
            lambda n=name: front.predictions.GetModelMetadata(
                get_model_metadata_pb2.GetModelMetadataRequest(
                    model_spec=model_pb2.ModelSpec(name=n), metadata_field=["signature_def"]
                ),
                _TIMEOUT,
            ),
            lambda n=name: front.models.GetModelStatus(
                get_model_status_pb2.GetModelStatusRequest(model_spec=model_pb2.ModelSpec(name=n)), _TIMEOUT
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as exc:
                call()
            assert _code(exc) == grpc.StatusCode.NOT_FOUND, (name, _details(exc))
    signatures = [
        "lookup",
        "row_count",
        *(f"upsert_{t.name}" for t in m.tables),
        *(f"delete_{t.name}" for t in m.tables),
    ]
    for model in (m.model_name, "half"):
        for sig in signatures:
            with pytest.raises(grpc.RpcError) as exc:
                front.predictions.Predict(_predict_request(model, ids, signature_name=sig), _TIMEOUT)
            assert _code(exc) == grpc.StatusCode.NOT_FOUND, (model, sig, _details(exc))


def test_passthrough_predict_versions_labels(front: Front) -> None:
    import tensorflow as tf

    x = {"x": tf.make_tensor_proto(np.array([1.0, 0.2], dtype=np.float32))}
    resp = front.predictions.Predict(_predict_request("half", x), _TIMEOUT)
    np.testing.assert_allclose(_only_output(resp), [3.5, 3.1], rtol=1e-6)  # latest is v2: 0.5 x + 3
    assert resp.model_spec.name == "half" and resp.model_spec.version.value == 2
    v1 = front.predictions.Predict(_predict_request("half", x, version=1), _TIMEOUT)
    np.testing.assert_allclose(_only_output(v1), [2.5, 2.1], rtol=1e-6)
    stable = front.predictions.Predict(_predict_request("half", x, version_label="stable"), _TIMEOUT)
    assert stable.model_spec.version.value == 1
    renamed = front.predictions.Predict(_predict_request("renamed", x, version=1), _TIMEOUT)
    assert renamed.model_spec.name == "renamed"
    only = _predict_request("half", x, signature_name="double")
    np.testing.assert_allclose(_only_output(front.predictions.Predict(only, _TIMEOUT)), [2.0, 0.4], rtol=1e-6)
    with pytest.raises(grpc.RpcError) as exc:  # not configured: passed to the backend, which does not know it
        front.predictions.Predict(_predict_request("half", x, version_label="nope"), _TIMEOUT)
    assert _code(exc) == grpc.StatusCode.INVALID_ARGUMENT and "nope" in _details(exc)
    with pytest.raises(grpc.RpcError) as exc:
        front.predictions.Predict(_predict_request("renamed", x, version=8), _TIMEOUT)
    assert (
        _code(exc) == grpc.StatusCode.NOT_FOUND and "renamed" in _details(exc) and "half" not in _details(exc)
    )
    with pytest.raises(grpc.RpcError) as exc:
        front.predictions.Predict(_predict_request("nope", x), _TIMEOUT)
    assert _code(exc) == grpc.StatusCode.NOT_FOUND and "nope" in _details(exc)


def test_passthrough_output_filter_and_unreadable_request(front: Front) -> None:
    """Requests with output_filter take the built-reply path (the gateway filters); others are relayed as bytes.
    Both answer the same outputs. Bytes that are no PredictRequest are INVALID_ARGUMENT, not INTERNAL."""
    import tensorflow as tf

    x = {
        "a": tf.make_tensor_proto(np.array([[1.0, 2.0], [0.5, 0.5]], dtype=np.float32)),
        "n": tf.make_tensor_proto(np.array([3, 4], dtype=np.int64)),
        "s": tf.make_tensor_proto(np.array([b"ab", b"c"], dtype=object)),
    }
    full = front.predictions.Predict(_predict_request("multi", x), _TIMEOUT)
    assert sorted(full.outputs) == ["len", "s_bytes", "sum"] and full.model_spec.name == "multi"
    req = _predict_request("multi", x)
    req.output_filter.append("sum")
    only = front.predictions.Predict(req, _TIMEOUT)
    assert list(only.outputs) == ["sum"] and only.model_spec.name == "multi"
    assert only.outputs["sum"].SerializeToString() == full.outputs["sum"].SerializeToString()
    np.testing.assert_allclose(tf.make_ndarray(only.outputs["sum"]), [6.0, 5.0])
    raw = front.channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    with pytest.raises(grpc.RpcError) as exc:
        raw(b"\xff\xff\xff", timeout=_TIMEOUT)
    assert _code(exc) == grpc.StatusCode.INVALID_ARGUMENT and "PredictRequest" in _details(exc)


def test_passthrough_classify_regress_metadata_status(front: Front) -> None:
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        input_pb2,
        model_pb2,
        regression_pb2,
    )

    inp = input_pb2.Input()
    for v in (1.5, 0.5):
        inp.example_list.examples.add().features.feature["x"].float_list.value.append(v)
    reg = front.predictions.Regress(
        regression_pb2.RegressionRequest(model_spec=model_pb2.ModelSpec(name="cr"), input=inp), _TIMEOUT
    )
    assert [r.value for r in reg.result.regressions] == [4.0, 2.0]
    cls = front.predictions.Classify(
        classification_pb2.ClassificationRequest(
            model_spec=model_pb2.ModelSpec(name="cr", signature_name="classify"), input=inp
        ),
        _TIMEOUT,
    )
    assert [[c.score for c in cl.classes] for cl in cls.result.classifications] == [[1.5, -0.5], [0.5, 0.5]]
    assert cls.model_spec.name == "cr"
    meta = front.predictions.GetModelMetadata(
        get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=model_pb2.ModelSpec(name="half"), metadata_field=["signature_def"]
        ),
        _TIMEOUT,
    )
    sigmap = get_model_metadata_pb2.SignatureDefMap()
    assert meta.metadata["signature_def"].Unpack(sigmap)
    assert {"serving_default", "double"} <= set(sigmap.signature_def)
    assert "lookup" not in sigmap.signature_def  # a PS signature name: hidden
    status = front.models.GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec=model_pb2.ModelSpec(name="half")), _TIMEOUT
    )
    assert sorted(s.version for s in status.model_version_status) == [1, 2]


def test_health_and_metrics(front: Front, demo_artifacts: Any) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(front.channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService"):
        assert stub.Check(health_pb2.HealthCheckRequest(service=service), _TIMEOUT).status == serving
    name = demo_artifacts.manifest.model_name
    assert stub.Check(health_pb2.HealthCheckRequest(service=name), _TIMEOUT).status == serving
    with pytest.raises(grpc.RpcError) as exc:
        stub.Check(health_pb2.HealthCheckRequest(service="no-such-model"), _TIMEOUT)
    assert _code(exc) == grpc.StatusCode.NOT_FOUND
    metrics = httpx.get(f"{front.url}/metrics", timeout=10).text
    ok = [
        x
        for x in metrics.splitlines()
        if x.startswith("embedgate_requests_total{") and f'model="{name}"' in x
    ]
    assert any('api="predict"' in x and 'outcome="OK"' in x for x in ok), ok
    assert any('outcome="INVALID_ARGUMENT"' in x for x in ok), ok


def _fallbacks(front: Front, step: str) -> float:
    """``embedgate_native_fallbacks_total{step}`` as the gateway reports it now (0 before the first one)."""
    for line in httpx.get(f"{front.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f'embedgate_native_fallbacks_total{{step="{step}"}} '):
            return float(line.split()[-1])
    return 0.0


def test_requests_the_native_reader_leaves_to_the_reference_are_counted(
    front: Front, demo_artifacts: Any
) -> None:
    """A request the native feature reader takes adds nothing to ``embedgate_native_fallbacks_total``; one it leaves
    to the reference (a valid gRPC tensor whose last value repeats; a malformed REST body) adds one to its step."""
    import tensorflow as tf

    if not native.available():
        pytest.skip("embedgate_native is not built (make install)")
    m = demo_artifacts.manifest
    instances = demo_artifacts.instances[:3]
    grpc_before, rest_before = _fallbacks(front, "grpc_features"), _fallbacks(front, "rest_features")
    tensors = _tensors(instances, m)
    front.predictions.Predict(_predict_request(m.model_name, tensors), _TIMEOUT)
    _rest_predictions(front, m.model_name, instances)
    assert _fallbacks(front, "grpc_features") == grpc_before
    assert _fallbacks(front, "rest_features") == rest_before

    single = next(f for f in m.sparse_features if f.kind.value == "single")
    one_id = int(tf.make_ndarray(tensors[single.name]).reshape(-1)[0])
    short = tf.make_tensor_proto(np.full(len(instances), one_id, np.int64))
    short.ClearField("tensor_content")
    short.int64_val.append(one_id)  # one value for a shape of three: TensorProto repeats the last one
    tensors[single.name] = short
    front.predictions.Predict(_predict_request(m.model_name, tensors), _TIMEOUT)
    assert _fallbacks(front, "grpc_features") == grpc_before + 1
    r = httpx.post(f"{front.url}/v1/models/{m.model_name}:predict", content=b'{"instances": [', timeout=30)
    assert r.status_code == 400, r.text
    assert _fallbacks(front, "rest_features") == rest_before + 1


def test_in_flight_limit_and_message_size(front: Front) -> None:
    import tensorflow as tf

    slow = front.predictions.Predict.future(
        _predict_request("slow", {"n": tf.make_tensor_proto(np.array([300_000], dtype=np.int32))}), _TIMEOUT
    )
    for _ in range(400):
        if "embedgate_requests_in_flight 1.0" in httpx.get(f"{front.url}/metrics", timeout=10).text:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the slow request never got in flight")
    x = {"x": tf.make_tensor_proto(np.array([1.0], dtype=np.float32))}
    with pytest.raises(grpc.RpcError) as exc:
        front.predictions.Predict(_predict_request("half", x), _TIMEOUT)
    assert _code(exc) == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_in_flight" in _details(exc)
    slow.result()
    big = {"x": tf.make_tensor_proto(np.zeros(2 * 1024 * 1024, dtype=np.float32))}  # 8 MiB > max_body_bytes
    with pytest.raises(grpc.RpcError) as exc:
        front.predictions.Predict(_predict_request("half", big), _TIMEOUT)
    assert _code(exc) == grpc.StatusCode.RESOURCE_EXHAUSTED, _details(exc)
    np.testing.assert_allclose(
        _only_output(front.predictions.Predict(_predict_request("half", x), _TIMEOUT)), [3.5]
    )


async def test_lifespan_starts_and_stops_the_grpc_server(passthrough_backend: Any) -> None:
    """In process: grpc_port 0 starts no server; a port starts one with the app and stops it with the app."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from gateway.app import create_app
    from schemas.gateway_settings import GatewaySettings

    models = passthrough_models(passthrough_backend.target)
    off = create_app(GatewaySettings(models=models))
    async with off.router.lifespan_context(off):
        assert off.state.runtime.grpc_port == 0
    port = free_port()
    gone = {
        "kind": "passthrough",
        "name": "gone",
        "target": f"127.0.0.1:{free_port()}",
    }  # nothing listens there
    app = create_app(GatewaySettings(models=[*models, gone], grpc_port=port))
    request = health_pb2.HealthCheckRequest(service="half")
    async with app.router.lifespan_context(app):
        assert app.state.runtime.grpc_port == port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            resp = await stub.Check(request, timeout=_TIMEOUT)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
            for service in ("gone", ""):  # one backend down: that model and the whole gateway are not serving
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=_TIMEOUT)
                assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING, service
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await health_pb2_grpc.HealthStub(channel).Check(request, timeout=2)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
