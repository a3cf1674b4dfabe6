"""The updater's expire schedule against real PS replicas (slab layout, a ttl_s table) served by serve-local.

Two replicas of each of two shards; rows exported at a known time; the :class:`updater.expiry.Expirer` (clock
injected) removes the rows older than the ttl on every replica, counts them per table, and a late message older than
the expiry cannot bring a row back while a newer one does."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from schemas.deployment import EmbeddingModel
from schemas.manifest import Manifest, ps_model_name, upsert_signature
from schemas.partition import shard_for
from schemas.proto import tfs_pb2
from schemas.tensors import from_ndarray, to_ndarray
from tests.support.servers import serve_local
from tests.updater.psmodel import lookup
from updater.expiry import Expirer
from updater.ingest import Route

pytestmark = pytest.mark.integration

EXPORTED_AT = 1_700_000_000_000
TTL_S = 60


def _build(root: Path) -> Manifest:
    manifest = Manifest.model_validate(
        {
            "model_name": "ttl",
            "version": 1,
            "tables": [
                {"name": "item", "dim": 2, "default_value": -1.0, "ttl_s": TTL_S, "rows": 20},
                {"name": "user", "dim": 2, "rows": 20},
            ],
            "sparse_features": [{"name": "item_id", "table": "item"}, {"name": "user_id", "table": "user"}],
            "partition": {"num_shards": 2},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
            "ps_layout": "slab",
        }
    )
    model_dir = root / "ttl"
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_text(manifest.dumps())
    script = textwrap.dedent(
        f"""
        import numpy as np
        from pathlib import Path
        from embedgate.export.ps import write_ps_shard
        from schemas.manifest import Manifest
        from schemas.partition import shard_for
        m = Manifest.load({str(model_dir)!r})
        ids = np.arange(20, dtype=np.int64)
        shards = shard_for(ids, m.num_shards)
        for s in range(m.num_shards):
            sel = ids[shards == s]
            rows = {{t: (sel, np.repeat(sel[:, None].astype(np.float32), 2, axis=1)) for t in ("item", "user")}}
            write_ps_shard(Path({str(model_dir)!r}) / f"ps_{{s}}" / "1", m.tables, rows, written_ms={EXPORTED_AT})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    return manifest


def _upsert(target: str, shard: int, ids: list[int], ts: int) -> int:
    req = tfs_pb2.PredictRequest(
        model_spec=tfs_pb2.ModelSpec(
            name=ps_model_name("ttl", shard), signature_name=upsert_signature("item")
        )
    )
    arr = np.asarray(ids, np.int64)
    inputs = {
        "ids": arr,
        "values": np.full((len(ids), 2), 7.0, np.float32),
        "timestamps_ms": np.full(len(ids), ts, np.int64),
        "seqs": np.zeros(len(ids), np.int64),
        "stream_partitions": np.zeros(0, object),
        "stream_offsets": np.zeros(0, np.int64),
        "stream_expected": np.zeros(0, np.int64),
    }
    for k, v in inputs.items():
        req.inputs[k].CopyFrom(from_ndarray(v.astype(np.bytes_) if v.dtype == object else v))
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(
            "/tensorflow.serving.PredictionService/Predict",
            request_serializer=tfs_pb2.PredictRequest.SerializeToString,
            response_deserializer=tfs_pb2.PredictResponse.FromString,
        )
        resp = call(req, timeout=30)
    return int(to_ndarray(resp.outputs["applied"]))


async def test_expire_on_every_replica_with_a_late_message(tmp_path: Path) -> None:
    manifest = _build(tmp_path)
    d = tmp_path / "ttl"
    served = {ps_model_name("ttl", s): d / f"ps_{s}" for s in range(2)}
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(serve_local(served))
        b = stack.enter_context(serve_local(served))
        config = EmbeddingModel(
            name="ttl",
            manifest=d,
            entry=a.target,
            shards=[{"replicas": [a.target, b.target]}, {"replicas": [a.target, b.target]}],  # type: ignore[list-item]
        )
        now = [EXPORTED_AT / 1000 + TTL_S - 1]
        registry = CollectorRegistry()
        expirer = Expirer({"ttl": Route(config, manifest)}, registry=registry, clock=lambda: now[0])
        try:
            assert expirer.active
            ids = np.arange(20, dtype=np.int64)
            owner = shard_for(ids, 2)
            # ids 0..4 are written a minute after the export: they outlive the exported rows
            for s in range(2):
                fresh = [int(i) for i in ids[:5] if owner[i] == s]
                for target in (a.target, b.target):
                    assert _upsert(target, s, fresh, EXPORTED_AT + 60_000) == len(fresh)
            assert await expirer.expire_once() == {("ttl", "item"): 0, ("ttl", "user"): 0}
            now[0] = EXPORTED_AT / 1000 + TTL_S + 1
            assert await expirer.expire_once() == {("ttl", "item"): 15, ("ttl", "user"): 0}
            assert (
                registry.get_sample_value(
                    "embedgate_updater_rows_expired_total", {"model": "ttl", "table": "item"}
                )
                == 15
            )
            for s in range(2):
                mine = ids[owner == s]
                for target in (a.target, b.target):  # every replica expired its own copy
                    rows = lookup(target, ps_model_name("ttl", s), manifest, "item", mine)
                    want = np.where((mine < 5)[:, None], 7.0, -1.0)
                    np.testing.assert_array_equal(rows, np.broadcast_to(want, rows.shape))
                    users = lookup(target, ps_model_name("ttl", s), manifest, "user", mine)
                    np.testing.assert_array_equal(users[:, 0], mine)  # no ttl_s: nothing expires
            # a late message from before the expiry cannot resurrect row 10; a newer one brings row 11 back
            s10, s11 = int(owner[10]), int(owner[11])
            assert _upsert(a.target, s10, [10], EXPORTED_AT + 1) == 0
            assert _upsert(a.target, s11, [11], EXPORTED_AT + 120_000) == 1
            assert lookup(a.target, ps_model_name("ttl", s10), manifest, "item", [10]).tolist() == [
                [-1.0, -1.0]
            ]
            assert lookup(a.target, ps_model_name("ttl", s11), manifest, "item", [11]).tolist() == [
                [7.0, 7.0]
            ]
        finally:
            await expirer.close()


async def test_a_replica_that_fails_is_counted_and_the_others_still_expire(tmp_path: Path) -> None:
    from tests.support.ports import free_port

    manifest = _build(tmp_path)
    d = tmp_path / "ttl"
    served = {ps_model_name("ttl", s): d / f"ps_{s}" for s in range(2)}
    dead = f"127.0.0.1:{free_port()}"
    with serve_local(served) as a:
        config = EmbeddingModel(
            name="ttl",
            manifest=d,
            entry=a.target,
            shards=[{"replicas": [a.target, dead]}, {"replicas": [a.target]}],  # type: ignore[list-item]
        )
        registry = CollectorRegistry()
        expirer = Expirer(
            {"ttl": Route(config, manifest)},
            registry=registry,
            deadline_s=2.0,
            clock=lambda: EXPORTED_AT / 1000 + TTL_S + 1,
        )
        try:
            assert await expirer.expire_once() == {("ttl", "item"): 20, ("ttl", "user"): 0}
            assert (
                registry.get_sample_value(
                    "embedgate_updater_expire_failures_total", {"model": "ttl", "shard": "0"}
                )
                == 1
            )
        finally:
            await expirer.close()
