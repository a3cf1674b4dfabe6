"""Overlapping writes and lookups on one slab-layout PS replica, through serve-local's gRPC Predict.

Several writer threads upsert and delete overlapping ids with distinct versions while readers look the ids up. The
layout runs each signature under one mutex per shard, so: every row a reader sees is one that was written for that
id (a slot freed by a delete and reused by an upsert never shows another id's row), and the final state is, key by
key, the newest write of each id, whatever order the calls ran in."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from schemas.manifest import PsLayout, TableSpec
from tests.support.servers import LocalServer, serve_local

pytestmark = pytest.mark.integration

DIM = 4
POOL = 2000  # ids the writers fight over
WRITERS, READERS, CALLS = 6, 2, 25


@pytest.fixture(scope="module")
def slab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    from embedgate.export.ps import write_ps_shard

    base = tmp_path_factory.mktemp("ps-conc") / "ps_0"
    ids = np.arange(0, POOL, 2, dtype=np.int64)
    write_ps_shard(
        base / "1",
        [TableSpec(name="t", dim=DIM, default_value=-1.0)],
        {"t": (ids, _row(ids, -1, -1))},
        layout=PsLayout.SLAB,
    )
    with serve_local({"m_ps_0": base}) as server:
        yield server


def _row(ids: np.ndarray, ts: np.ndarray | int, seq: np.ndarray | int) -> np.ndarray:
    """A row naming its id and version: [id, ts, seq, id]."""
    n = len(ids)
    ts_a = np.broadcast_to(np.asarray(ts, np.float32), (n,))
    seq_a = np.broadcast_to(np.asarray(seq, np.float32), (n,))
    return np.stack([ids.astype(np.float32), ts_a, seq_a, ids.astype(np.float32)], 1)


def _predict(
    stub: prediction_service_pb2_grpc.PredictionServiceStub, sig: str, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "m_ps_0"
    req.model_spec.signature_name = sig
    for k, v in inputs.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    resp = stub.Predict(req, 60)
    return {k: tf.make_ndarray(v) for k, v in resp.outputs.items()}


def test_overlapping_writes_and_lookups_keep_every_row(slab_server: LocalServer) -> None:
    # the state before any write: even ids exported with version (-1, -1)
    final: dict[int, tuple[tuple[int, int], bool]] = {int(i): ((-1, -1), True) for i in range(0, POOL, 2)}
    log: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
    log_lock = threading.Lock()
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(k: int) -> None:
        rng = np.random.default_rng(100 + k)
        with grpc.insecure_channel(slab_server.target) as ch:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            for c in range(CALLS):
                n = int(rng.integers(1, 2000))
                ids = rng.integers(0, POOL, n).astype(np.int64)
                ts = rng.integers(0, 1000, n).astype(np.int64)
                seqs = (np.arange(n) * WRITERS * CALLS + c * WRITERS + k).astype(np.int64)  # unique versions
                feeds = {
                    "ids": ids,
                    "timestamps_ms": ts,
                    "seqs": seqs,
                    "stream_partitions": np.zeros(0, object),
                    "stream_offsets": np.zeros(0, np.int64),
                    "stream_expected": np.zeros(0, np.int64),
                }
                upsert = bool(rng.random() < 0.65)
                if upsert:
                    _predict(stub, "upsert_t", {**feeds, "values": _row(ids, ts, seqs)})
                else:
                    _predict(stub, "delete_t", feeds)
                with log_lock:
                    log.append((ids, ts, seqs, upsert))

    def reader() -> None:
        probe = np.arange(POOL, dtype=np.int64)
        with grpc.insecure_channel(slab_server.target) as ch:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            while not done.is_set():
                rows = _predict(stub, "lookup", {"t_ids": probe})["t_values"]
                present = rows[:, 0] != -1
                # every row seen belongs to its id (a row, or the default row of an absent id)
                assert (rows[present, 0] == probe[present]).all() and (
                    rows[present, 3] == probe[present]
                ).all()
                assert (rows[~present] == -1).all()

    def run(fn: object, *args: int) -> threading.Thread:
        def guarded() -> None:
            try:
                fn(*args)  # type: ignore[operator]
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

        t = threading.Thread(target=guarded)
        t.start()
        return t

    readers = [run(reader) for _ in range(READERS)]
    writers = [run(writer, k) for k in range(WRITERS)]
    for t in writers:
        t.join(600)
    done.set()
    for t in readers:
        t.join(600)
    assert not errors, errors
    assert len(log) == WRITERS * CALLS
    for ids, ts, seqs, upsert in log:  # newest wins per id; versions are unique, so the order does not matter
        for i, t_, s_ in zip(ids.tolist(), ts.tolist(), seqs.tolist(), strict=True):
            if i not in final or (t_, s_) >= final[i][0]:
                final[i] = ((t_, s_), upsert)
    with grpc.insecure_channel(slab_server.target) as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        probe = np.arange(POOL, dtype=np.int64)
        rows = _predict(stub, "lookup", {"t_ids": probe})["t_values"]
        count = int(_predict(stub, "row_count", {})["t_rows"])
    for i in range(POOL):
        version, live = final.get(i, ((-1, -1), False))
        want = _row(np.array([i]), *version)[0] if live else np.full(DIM, -1.0, np.float32)
        np.testing.assert_array_equal(rows[i], want, err_msg=f"id {i}")
    assert count == sum(1 for _, live in final.values() if live)
