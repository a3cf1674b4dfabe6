"""The gRPC front's express lane (``gateway/grpc_front/express.py``) against the general path (``grpc_express:
false``): the same answers, byte for byte, the same errors and the same bookkeeping, and the lane serves exactly the
calls it is meant to.

Real everything: the small demo model on its own serve-local, the session's Kafka broker feeding both gateways'
hot-row caches (one topic, no deltas), two gateway subprocesses alike but for ``grpc_express``, gRPC on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml

from schemas.proto import tfs_pb2
from tests.support.kafka import Broker
from tests.support.ports import free_port
from tests.support.stack import metric_sum

pytestmark = pytest.mark.integration

_PREDICT = "/tensorflow.serving.PredictionService/Predict"
_WAIT_S = 60.0


def _request(manifest: Any, instances: list[dict[str, Any]], signature: str = "serving_default") -> Any:
    """The features as the gateway's gRPC front takes them (docs/gateway.md, "gRPC"), as ``tf.make_tensor_proto``
    writes them: ids int64 [B] or -1-padded [B, L], dense float32 [B, dim]."""
    from schemas.manifest import FeatureKind

    req = tfs_pb2.PredictRequest()
    req.model_spec.name = manifest.model_name
    req.model_spec.signature_name = signature
    b = len(instances)

    def put(name: str, arr: np.ndarray, dtype: int) -> None:
        t = req.inputs[name]
        t.dtype = dtype
        for d in arr.shape:
            t.tensor_shape.dim.add().size = d
        t.tensor_content = arr.tobytes()

    for f in manifest.sparse_features:
        if f.kind is FeatureKind.SINGLE:
            ids = np.array([int(np.ravel(x[f.name])[0]) for x in instances], np.int64)
            put(f.name, ids, 9)
            continue
        lists = [list(np.ravel(x.get(f.name, []))) for x in instances]
        width = max(1, max(len(v) for v in lists))
        padded = np.full((b, width), -1, np.int64)
        for i, v in enumerate(lists):
            padded[i, : len(v)] = v
        put(f.name, padded, 9)
    for d in manifest.dense_features:
        put(d.name, np.array([x[d.name] for x in instances], np.float32).reshape(b, d.dim), 1)
    return req


async def _call(channel: grpc.aio.Channel, req: Any) -> tuple[str, bytes | str, tuple[Any, ...]]:
    """("OK", reply bytes, trailers) or (status name, details, ())."""
    call = channel.unary_unary(_PREDICT, request_serializer=type(req).SerializeToString)(req, timeout=30)
    try:
        reply = await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or "", ()
    return "OK", reply, tuple(await call.trailing_metadata() or ())


def _samples(text: str, name: str) -> dict[str, float]:
    """Every sample of ``name`` by its label text, from Prometheus exposition ``text``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_the_express_lane_answers_and_counts_as_the_general_path(
    kafka: Broker, demo_artifacts: Any, tmp_path: Path
) -> None:
    from embedgate.export.demo import make_examples
    from schemas.deltas import delta_topic
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import embedding_model, exported_backends

    manifest = demo_artifacts.manifest
    name = manifest.model_name
    served = exported_backends(demo_artifacts.model_dir)

    async def create_topic() -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            topic = delta_topic(name)
            if topic not in await admin.list_topics():
                await admin.create_topics(
                    [NewTopic(topic, num_partitions=manifest.num_shards, replication_factor=1)]
                )
        finally:
            await admin.close()

    asyncio.run(create_topic())
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serve_local(served))
        model = embedding_model(
            demo_artifacts.model_dir, entry=server.target, shards=[[server.target]] * manifest.num_shards
        )
        gateways: dict[str, tuple[Any, str]] = {}
        for lane in ("express", "general"):
            port = free_port()
            cfg = tmp_path / f"{lane}.yaml"
            doc = {
                "models": [model],
                "grpc_port": port,
                "grpc_express": lane == "express",
                "cache": {"max_bytes": 1 << 22, "bootstrap_servers": kafka.bootstrap, "settle_s": 0.0},
            }
            cfg.write_text(yaml.safe_dump(doc))
            gw = stack.enter_context(run_gateway(cfg))
            gateways[lane] = (gw, f"127.0.0.1:{port}")
        for gw, _ in gateways.values():
            stop = time.monotonic() + _WAIT_S
            while (
                not httpx.get(f"{gw.url}/readyz", timeout=5)
                .json()
                .get("cache", {})
                .get("models", {})
                .get(name, {})
                .get("serving")
            ):
                assert time.monotonic() < stop, "the hot-row cache did not start serving"
                time.sleep(0.1)

        instances = list(demo_artifacts.instances)
        many, _ = make_examples(64, 5_000, seed=7)
        express_calls = [
            _request(manifest, instances[:1]),
            _request(manifest, instances),
            _request(manifest, many),
            _request(manifest, many, signature=""),  # the default signature
        ]
        versioned = _request(manifest, instances)
        versioned.model_spec.version.value = manifest.version
        other_signature = _request(manifest, instances, signature="nope")
        unknown_model = _request(manifest, instances)
        unknown_model.model_spec.name = "nobody"
        fresh, _ = make_examples(8, 5_000, seed=99)  # rows not cached yet: a miss, the general path

        async def scenario() -> dict[str, list[Any]]:
            got: dict[str, list[Any]] = {}
            for lane, (gw, address) in gateways.items():
                async with grpc.aio.insecure_channel(address) as channel:
                    for req in express_calls:  # first pass: misses (the general path) fill the cache
                        first = await _call(channel, req)
                    output = next(iter(tfs_pb2.PredictResponse.FromString(first[1]).outputs))
                    filtered = _request(manifest, instances)
                    filtered.output_filter.append(output)
                    got[lane] = [await _call(channel, req) for req in express_calls]
                    got[lane].append(await _metric_text(gw.url))
                    for req in (
                        versioned,
                        filtered,
                        other_signature,
                        unknown_model,
                        _request(manifest, fresh),
                    ):
                        got[lane].append(await _call(channel, req))
                    got[lane].append(await _metric_text(gw.url))
            return got

        got = asyncio.run(scenario())

    express, general = got["express"], got["general"]
    n = len(express_calls)
    for i in range(n):
        assert express[i][0] == "OK", express[i]
        assert express[i] == general[i], f"call {i}: the lanes answer differently"
    fallbacks = range(n + 1, len(express) - 1)
    for i in fallbacks:
        assert express[i][:2] == general[i][:2], f"fallback call {i - n - 1}: the lanes answer differently"
    codes = [express[i][0] for i in fallbacks]
    assert codes == ["OK", "OK", "INVALID_ARGUMENT", "NOT_FOUND", "OK"], (
        codes
    )  # version, filter, signature, model, miss

    for mid, end in ((n, len(express) - 1),):
        # the second pass (and the first pass's last call, whose rows the one before it cached)
        served = metric_sum(express[mid], "embedgate_grpc_express_total", {"model": name})
        assert served == n + 1, "the lane serves every eligible call whose rows are cached"
        assert metric_sum(express[end], "embedgate_grpc_express_total") == served, "and nothing else"
        assert metric_sum(general[end], "embedgate_grpc_express_total") == 0
        for metric in (
            "embedgate_requests_total",
            "embedgate_cache_hits_total",
            "embedgate_cache_misses_total",
            "embedgate_grpc_request_bytes_total",
            "embedgate_in_flight",
        ):
            for at in (mid, end):
                assert _samples(express[at], metric) == _samples(general[at], metric), (metric, at)


async def _metric_text(url: str) -> str:
    async with httpx.AsyncClient(timeout=10) as client:
        return (await client.get(f"{url}/metrics")).text
