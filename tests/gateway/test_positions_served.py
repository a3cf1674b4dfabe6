"""Reads never see a replica's regression, with real parts: the demo served by two serve-local replicas of every PS
shard (server A also serves the entry), the gateway in front (in process, REST and gRPC), rows written to the PS with
stream positions as the updater writes them (``upsert_<t>`` with ``stream_partitions``/``stream_offsets``).

* B restarts (it reloads its export: the written rows and its positions are gone): once the gateway has polled its
  position, every prediction equals the one computed from the written rows (none from B's export rows) and none is
  marked; ``embedgate_replicas_catching_up`` and /readyz say one replica per shard is catching up.
* A restarts too (no caught-up replica left): answers are still served, from the export rows, and marked
  ``replica_catching_up`` (REST header, gRPC trailer, metric).
* The rows and positions are written again: the marks disappear.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.codec.tensor import from_ndarray
from schemas.manifest import lookup_ids_input, lookup_values_output, upsert_signature
from schemas.partition import shard_for
from schemas.proto import tfs_pb2
from tests.gateway.test_version_pinning import _metric
from tests.support.ports import free_port
from tests.support.servers import serve_local

pytestmark = pytest.mark.integration

MODEL = "demo"
TABLE = "user_emb"
KEY = "positions-test:0"  # the "<topic>:<partition>" the writes record
_RTOL, _ATOL = 1e-5, 1e-6
_WAIT_S = 120.0  # bound on waiting for the gateway to see a replica's position (restarts included)
_PREDICT = "/tensorflow.serving.PredictionService/Predict"


def _upsert(target: str, shard: int, ids: np.ndarray, values: np.ndarray, offset: int) -> None:
    """Write ``ids``' rows to one replica's ``upsert_user_emb``, recording ``offset`` as the next offset on KEY."""
    req = tfs_pb2.PredictRequest(
        model_spec=tfs_pb2.ModelSpec(name=f"{MODEL}_ps_{shard}", signature_name=upsert_signature(TABLE))
    )
    n = len(ids)
    inputs = {
        "ids": ids.astype(np.int64),
        "values": values.astype(np.float32),
        "timestamps_ms": np.full(n, 1000, np.int64),
        "seqs": np.zeros(n, np.int64),
        "stream_partitions": np.array([KEY.encode()], dtype=object),
        "stream_offsets": np.array([offset], np.int64),
        "stream_expected": np.array([-1], np.int64),  # move the position unconditionally
    }
    for k, v in inputs.items():
        req.inputs[k].CopyFrom(from_ndarray(v))
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(
            _PREDICT,
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )
        call(req, timeout=30)


def _lookup(target: str, shard: int, tables: list[str], ids: np.ndarray) -> np.ndarray:
    """Rows of ``ids`` in TABLE on one replica (its ``lookup`` signature; every other table asked for no ids)."""
    req = tfs_pb2.PredictRequest(
        model_spec=tfs_pb2.ModelSpec(name=f"{MODEL}_ps_{shard}", signature_name="lookup")
    )
    for t in tables:
        req.inputs[lookup_ids_input(t)].CopyFrom(
            from_ndarray(ids.astype(np.int64) if t == TABLE else np.zeros(0, np.int64))
        )
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(
            _PREDICT,
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )
        resp = call(req, timeout=30)
    from gateway.codec.tensor import to_ndarray

    return np.asarray(to_ndarray(resp.outputs[lookup_values_output(TABLE)]))


async def _eventually(
    check: Callable[[], Awaitable[bool]],
    what: str,
    explain: Callable[[], str] = str,
    timeout_s: float = _WAIT_S,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what} ({explain()})")
        await asyncio.sleep(0.1)


async def test_reads_go_to_caught_up_replicas_and_are_marked_when_none_is(
    demo_artifacts: Any, tmp_path: Path
) -> None:
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from gateway.codec.tensor import to_ndarray
    from tests.gateway.conftest import app_and_client
    from tests.gateway.test_grpc_front import _predict_request, _tensors

    manifest = demo_artifacts.manifest
    md = demo_artifacts.model_dir
    tables = [t.name for t in manifest.tables]
    dim = manifest.table(TABLE).dim
    users = np.unique(np.array([i["user_id"] for i in demo_artifacts.instances], dtype=np.int64))
    user_shard = shard_for(users, manifest.num_shards)
    assert set(user_shard.tolist()) == {0, 1}  # both shards hold written rows
    new_rows = np.random.default_rng(11).normal(0.0, 0.5, (len(users), dim)).astype(np.float32)

    port_a, port_b = free_port(), free_port()
    a, b = f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"
    ps = {f"{MODEL}_ps_{s}": md / f"ps_{s}" for s in range(manifest.num_shards)}
    models_a = {f"{MODEL}_entry": md / "entry", **ps}

    def write_all(targets: list[str], offset: int) -> None:
        for target in targets:
            for s in range(manifest.num_shards):
                mask = user_shard == s
                _upsert(target, s, users[mask], new_rows[mask], offset)

    gateway_model = {
        "kind": "embedding",
        "name": MODEL,
        "manifest": str(md),
        "entry": a,
        "shards": [{"replicas": [a, b]} for _ in range(manifest.num_shards)],
    }
    body = json.dumps({"instances": demo_artifacts.instances})
    grpc_port = free_port()
    # replica_retry_s 0: only the catching-up flags decide which replica is read first (checked: without them, this
    # test fails)

    with contextlib.ExitStack() as stack:
        servers = {}
        servers[a] = await asyncio.to_thread(stack.enter_context, serve_local(models_a, port=port_a))
        servers[b] = await asyncio.to_thread(stack.enter_context, serve_local(ps, port=port_b))

        async def restart(target: str, models: dict[str, Path], port: int) -> None:
            proc = servers[target].proc
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
            servers[target] = await asyncio.to_thread(stack.enter_context, serve_local(models, port=port))

        async with app_and_client(
            models=[gateway_model],
            grpc_port=grpc_port,
            grpc={"position_poll_s": 0.2, "replica_retry_s": 0},
            health_poll_s=0.2,
        ) as (app, gw):
            tracker = app.state.runtime.positions[MODEL]

            async def polled_after_now() -> None:
                """Until a poll that began after this call has ended: the gateway has seen what was written before.
                (A replica that lost writes no poll saw is not flagged: it has no past of its own to be below.)"""
                start = tracker.polls

                async def two_more() -> bool:
                    return bool(tracker.polls >= start + 2)

                await _eventually(two_more, "two more position polls")

            def explain() -> str:
                return "; ".join(
                    f"shard {i}: catching up {st.catching_up}, last reports {st.last}, own past {st.own}, "
                    f"targets {st.targets}"
                    for i, st in enumerate(tracker.state)
                )

            async def ready_again() -> bool:  # /readyz answers from the readiness poll after the restarts
                return (await gw.get("/readyz")).status_code == 200

            async def predict() -> tuple[np.ndarray, str | None]:
                r = await gw.post(f"/v1/models/{MODEL}:predict", content=body)
                assert r.status_code == 200, r.text
                return np.asarray(r.json()["predictions"], np.float32).ravel(), r.headers.get(
                    "X-Embedgate-Degraded"
                )

            async def catching_up(shard: int) -> float:
                text = (await gw.get("/metrics")).text
                return _metric(text, "embedgate_replicas_catching_up", model=MODEL, shard=str(shard))

            async def gauges(n: int) -> bool:
                return all([await catching_up(s) == n for s in range(manifest.num_shards)])

            async def marked() -> float:
                text = (await gw.get("/metrics")).text
                return _metric(
                    text, "embedgate_degraded_responses_total", model=MODEL, reason="replica_catching_up"
                )

            old, mark = await predict()
            assert mark is None
            await asyncio.to_thread(write_all, [a, b], 100)
            await polled_after_now()
            new, mark = await predict()
            assert mark is None
            # the premise: every instance's answer depends on the written rows
            assert np.all(np.abs(new - old) > 10 * (_ATOL + _RTOL * np.abs(old))), (old, new)

            def which(preds: np.ndarray) -> str:
                for name, want in (("old", old), ("new", new)):
                    if np.allclose(preds, want, rtol=_RTOL, atol=_ATOL):
                        return name
                return "mix"

            # ---- B restarts: its export rows are back, its positions gone; reads go to A, unmarked
            await restart(b, ps, port_b)
            b_rows = await asyncio.to_thread(_lookup, b, 0, tables, users[user_shard == 0])
            assert not np.allclose(b_rows, new_rows[user_shard == 0])  # the premise: B lost the writes
            await _eventually(lambda: gauges(1), "the gateway sees B catching up on every shard", explain)
            for _ in range(8):  # round robin would send every other lookup of each shard to B
                preds, mark = await predict()
                assert (which(preds), mark) == ("new", None)
            await _eventually(ready_again, "the readiness poll sees both replicas again")
            ready = (await gw.get("/readyz")).json()
            assert ready["status"] == "ready"
            assert ready["replicas"] == {
                MODEL: {str(s): {"replicas": 2, "catching_up": 1} for s in range(manifest.num_shards)}
            }
            assert await marked() == 0

            # ---- A restarts too: no caught-up replica; answers are served (export rows) and marked
            await restart(a, models_a, port_a)
            await _eventually(
                lambda: gauges(2), "the gateway sees A and B catching up on every shard", explain
            )
            for _ in range(3):
                preds, mark = await predict()
                assert (which(preds), mark) == ("old", "replica_catching_up")
            r = await gw.post(f"/v1/models/{MODEL}/versions/{manifest.version}:predict", content=body)
            assert r.status_code == 200, r.text  # an explicit version is marked the same way
            assert r.headers.get("X-Embedgate-Degraded") == "replica_catching_up"
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                call = stub.Predict(_predict_request(MODEL, _tensors(demo_artifacts.instances, manifest)))
                resp = await call
                trailing = dict(await call.trailing_metadata())
            assert trailing.get("x-embedgate-degraded") == "replica_catching_up"
            got = np.asarray(to_ndarray(next(iter(resp.outputs.values()))), np.float32).ravel()
            assert which(got) == "old"
            await _eventually(ready_again, "the readiness poll sees both replicas again")
            ready = (await gw.get("/readyz")).json()
            assert ready["status"] == "ready", ready  # catching up never makes the gateway unready
            assert await marked() == 5

            # ---- the rows and positions are written again (as the updater's replay does): the marks disappear
            await asyncio.to_thread(write_all, [a, b], 100)
            await _eventually(lambda: gauges(0), "the gateway sees A and B caught up", explain)
            for _ in range(4):
                preds, mark = await predict()
                assert (which(preds), mark) == ("new", None)
            assert await marked() == 5
