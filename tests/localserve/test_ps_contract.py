"""The exporter's PS SavedModels through serve-local: lookup / upsert_<t> / delete_<t> / row_count via gRPC Predict,
writes persisting in the loaded version. Uses ``embedgate.export.ps.write_ps_shard`` (small, no Keras) and, when the
exporter's demo exists, the root ``demo_backends`` fixture."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from schemas.manifest import (
    LOOKUP_SIGNATURE,
    ROW_COUNT_SIGNATURE,
    STREAM_POSITION_SIGNATURE,
    PsLayout,
    TableSpec,
    delete_signature,
    lookup_ids_input,
    lookup_values_output,
    row_count_output,
    stream_offsets_output,
    stream_partitions_output,
    upsert_signature,
)
from tests.support.servers import LocalServer, serve_local

pytestmark = pytest.mark.integration

SPECS = [TableSpec(name="a", dim=3, default_value=-1.0), TableSpec(name="b", dim=2)]


@pytest.fixture(scope="module", params=list(PsLayout))
def ps_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalServer]:
    """A PS shard of either layout: the hash layout is what artifacts exported before the slab layout hold."""
    from embedgate.export.ps import write_ps_shard

    base = tmp_path_factory.mktemp("ps-model") / "ps_0"
    rows = {
        "a": (np.array([1, 2], np.int64), np.arange(6, dtype=np.float32).reshape(2, 3)),
        "b": (np.array([7], np.int64), np.array([[0.5, 0.25]], np.float32)),
    }
    write_ps_shard(base / "1", SPECS, rows, layout=PsLayout(request.param))
    with serve_local({"m_ps_0": base}) as server:
        yield server


def _run(target: str, model: str, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    req.model_spec.signature_name = signature
    for k, v in inputs.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    with grpc.insecure_channel(target) as ch:
        resp = prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(req, 30)
    return {k: tf.make_ndarray(v) for k, v in resp.outputs.items()}


def _ids(*ids: int) -> np.ndarray:
    return np.array(ids, np.int64)


def _versioned(ids: np.ndarray, ts: int, *, position: dict[str, int] | None = None) -> dict[str, Any]:
    """The version and stream-position inputs every write takes (one timestamp, sequence 0 for every id)."""
    pos = position or {}
    return {
        "ids": ids,
        "timestamps_ms": np.full(len(ids), ts, np.int64),
        "seqs": np.zeros(len(ids), np.int64),
        "stream_partitions": tf.constant(list(pos), tf.string, shape=[len(pos)]).numpy(),
        "stream_offsets": np.array(list(pos.values()), np.int64),
        "stream_expected": np.full(len(pos), -1, np.int64),
    }


def test_ps_signatures_through_serve_local(ps_server: LocalServer) -> None:
    t, m = ps_server.target, "m_ps_0"
    counts = _run(t, m, ROW_COUNT_SIGNATURE, {})
    assert counts == {row_count_output("a"): 2, row_count_output("b"): 1}
    out = _run(t, m, LOOKUP_SIGNATURE, {lookup_ids_input("a"): _ids(2, 99), lookup_ids_input("b"): _ids(7)})
    np.testing.assert_array_equal(out[lookup_values_output("a")], [[3, 4, 5], [-1, -1, -1]])
    np.testing.assert_array_equal(out[lookup_values_output("b")], [[0.5, 0.25]])
    up = _run(
        t,
        m,
        upsert_signature("a"),
        {**_versioned(_ids(99, 1), 1000, position={"d:0": 5}), "values": np.full((2, 3), 9.0, np.float32)},
    )
    assert (int(up["rows"]), int(up["applied"]), up["stream_previous"].tolist()) == (3, 2, [-1])
    after = _run(t, m, LOOKUP_SIGNATURE, {lookup_ids_input("a"): _ids(99, 1), lookup_ids_input("b"): _ids()})
    np.testing.assert_array_equal(after[lookup_values_output("a")], np.full((2, 3), 9.0))
    older = {**_versioned(_ids(1), 999), "values": np.full((1, 3), 1.0, np.float32)}
    assert (
        int(_run(t, m, upsert_signature("a"), older)["applied"]) == 0
    )  # newest wins: an older row is ignored
    assert int(_run(t, m, delete_signature("a"), _versioned(_ids(99, 12345), 1001))["rows"]) == 2
    assert _run(t, m, ROW_COUNT_SIGNATURE, {})[row_count_output("a")] == 2
    pos = _run(t, m, STREAM_POSITION_SIGNATURE, {})
    assert [k.decode() for k in pos[stream_partitions_output("a")].tolist()] == ["d:0"]
    assert pos[stream_offsets_output("a")].tolist() == [5]
    assert pos[stream_offsets_output("b")].tolist() == []


def test_ps_metadata_lists_the_contract(ps_server: LocalServer) -> None:
    req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    req.model_spec.name = "m_ps_0"
    with grpc.insecure_channel(ps_server.target) as ch:
        resp = prediction_service_pb2_grpc.PredictionServiceStub(ch).GetModelMetadata(req, 30)
    sigs = get_model_metadata_pb2.SignatureDefMap()
    resp.metadata["signature_def"].Unpack(sigs)
    names = set(sigs.signature_def) - {"__saved_model_init_op"}  # TF Serving lists the TF2 init op, too
    assert names == {"lookup", "row_count", "stream_position", "upsert_a", "upsert_b", "delete_a", "delete_b"}


@pytest.mark.skipif(
    importlib.util.find_spec("embedgate.export.demo") is None,
    reason="embedgate.export.demo (build_demo) not written yet",
)
def test_demo_ps_through_serve_local(demo_backends: Any, demo_artifacts: Any) -> None:
    manifest = demo_artifacts.manifest
    target = demo_backends.target
    for shard in range(manifest.num_shards):
        model = f"{manifest.model_name}_ps_{shard}"
        counts = _run(target, model, ROW_COUNT_SIGNATURE, {})
        assert set(counts) == {row_count_output(t.name) for t in manifest.tables}
        table = manifest.tables[0]
        new_id = 2**62 + shard  # far outside the demo's vocabulary
        ids = {lookup_ids_input(t.name): _ids() for t in manifest.tables}
        ids[lookup_ids_input(table.name)] = _ids(new_id)
        before = _run(target, model, LOOKUP_SIGNATURE, ids)[lookup_values_output(table.name)]
        np.testing.assert_array_equal(before, np.full((1, table.dim), table.default_value, np.float32))
        row = np.arange(table.dim, dtype=np.float32).reshape(1, table.dim)
        feeds = {**_versioned(_ids(new_id), 1), "values": row}
        rows = _run(target, model, upsert_signature(table.name), feeds)["rows"]
        assert int(rows) == int(counts[row_count_output(table.name)]) + 1
        after = _run(target, model, LOOKUP_SIGNATURE, ids)[lookup_values_output(table.name)]
        np.testing.assert_array_equal(after, row)
        _run(target, model, delete_signature(table.name), _versioned(_ids(new_id), 2))
    assert isinstance(Path(demo_artifacts.model_dir), Path)


@pytest.mark.skipif(
    importlib.util.find_spec("embedgate.export.demo") is None,
    reason="embedgate.export.demo (build_demo) not written yet",
)
def test_demo_entry_through_serve_local(demo_backends: Any, demo_artifacts: Any) -> None:
    """The Keras-exported entry model: inputs from GetModelMetadata, outputs as the manifest says."""
    manifest = demo_artifacts.manifest
    model = f"{manifest.model_name}_entry"
    req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    req.model_spec.name = model
    with grpc.insecure_channel(demo_backends.target) as ch:
        resp = prediction_service_pb2_grpc.PredictionServiceStub(ch).GetModelMetadata(req, 30)
    sigs = get_model_metadata_pb2.SignatureDefMap()
    resp.metadata["signature_def"].Unpack(sigs)
    sig = sigs.signature_def[manifest.entry.signature_name]
    inputs = {}
    for name, info in sig.inputs.items():
        dims = [d.size for d in info.tensor_shape.dim]
        assert dims[0] == -1, (name, dims)
        if (
            info.dtype == tf.int32.as_datatype_enum
        ):  # a unique_rows entry (docs/export.md): indices, row splits
            inputs[name] = (
                np.arange(4, dtype=np.int32) if name.startswith("splits__") else np.zeros(3, np.int32)
            )
        elif name.startswith("rows__"):  # one row per table that every example reads
            inputs[name] = np.full([1, *dims[1:]], 0.1, np.float32)
        else:
            assert info.dtype == tf.float32.as_datatype_enum, (name, info.dtype)
            inputs[name] = np.full([3, *dims[1:]], 0.1, np.float32)
    out = _run(demo_backends.target, model, manifest.entry.signature_name, inputs)
    assert set(out) == {o.name for o in manifest.entry.outputs}
    for value in out.values():
        assert value.shape[0] == 3 and np.isfinite(value).all()
