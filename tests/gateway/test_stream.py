"""gateway.stream: lag decides whether caches serve; an unreachable broker turns the cache off (predictions still work)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest

from gateway.cache import RowCache
from gateway.stream import DeltaStream
from schemas.cache_settings import CacheSettings
from schemas.deltas import EmbeddingDelta, encode_delta, encode_hps
from schemas.manifest import Manifest
from tests.gateway.conftest import app_client
from tests.gateway.test_rest_embedding import embedding_model
from tests.support.ports import free_port

MANIFEST = Manifest.model_validate(
    {
        "model_name": "m",
        "version": 1,
        "tables": [{"name": "t", "dim": 2}],
        "sparse_features": [{"name": "f", "table": "t"}],
        "partition": {"num_shards": 1},
        "entry": {"outputs": [{"name": "score", "shape": [1]}]},
    }
)


class _FakeConsumer:
    """What DeltaStream reads of an aiokafka consumer after a fetch."""

    def __init__(self) -> None:
        self.tp = ("topic", 0)
        self.high = 10
        self.pos = 10
        self.polled_ms = int(time.time() * 1000)

    def assignment(self) -> set[Any]:
        return {self.tp}

    def highwater(self, tp: Any) -> int:
        return self.high

    def last_poll_timestamp(self, tp: Any) -> int:
        return self.polled_ms

    async def position(self, tp: Any) -> int:
        return self.pos


def _stream() -> tuple[DeltaStream, RowCache]:
    cache = RowCache("m", {"t": 2}, 1 << 20, settle_s=0)
    return DeltaStream(CacheSettings(max_bytes=1 << 20, max_lag_s=5), {"m": cache}, {"m": MANIFEST}), cache


def test_caught_up_serves_and_lagging_stops() -> None:
    stream, cache = _stream()
    consumer = _FakeConsumer()
    consumer.pos = 3  # behind: not caught up yet
    asyncio.run(stream._check_lag(consumer))
    assert not cache.serving and "not caught up" in cache.reason
    consumer.pos = 10
    asyncio.run(stream._check_lag(consumer))
    assert cache.serving and stream.lag_s < 5
    consumer.polled_ms -= 60_000  # fetches stopped answering a minute ago (broker gone)
    stream._caught_up_at = consumer.polled_ms / 1000
    asyncio.run(stream._check_lag(consumer))
    assert not cache.serving and "more than cache.max_lag_s 5 s" in cache.reason


def test_deltas_update_cached_rows_and_bad_ones_are_skipped() -> None:
    stream, cache = _stream()
    cache.set_serving(True)
    cache.fill(cache.begin_read(), "t", np.array([1]), np.zeros((1, 2), dtype=np.float32))

    class _Rec:
        topic, partition, offset, key, timestamp = "embedgate.deltas", 0, 0, None, 0

        def __init__(self, value: bytes) -> None:
            self.value = value

    good = EmbeddingDelta(
        model="m",
        table="t",
        op="upsert",
        ids=[1],
        values=[[1.0, 2.0]],
        producer="p",
        timestamp_ms=0,
        sequence=0,
    )
    wrong_dim = EmbeddingDelta(
        model="m",
        table="t",
        op="upsert",
        ids=[1],
        values=[[9.0, 9.0, 9.0]],
        producer="p",
        timestamp_ms=0,
        sequence=0,
    )
    stream._apply(_Rec(encode_delta(good)))
    stream._apply(_Rec(encode_delta(wrong_dim)))
    stream._apply(_Rec(b"garbage"))
    mask, rows = cache.get("t", np.array([1]))
    assert mask.tolist() == [True] and rows.tolist() == [[1.0, 2.0]]
    assert stream.applied == 1


def test_hps_records_update_cached_rows() -> None:
    stream, cache = _stream()
    cache.set_serving(True)
    cache.fill(cache.begin_read(), "t", np.array([5, 6]), np.zeros((2, 2), dtype=np.float32))

    class _Rec:
        topic, partition, offset, key, timestamp = "hps_et.m.t", 0, 7, None, 0
        value = encode_hps([6], np.array([[3.0, 4.0]], dtype=np.float32))

    stream._apply(_Rec())
    mask, rows = cache.get("t", np.array([5, 6]))
    assert mask.tolist() == [True, True] and rows.tolist() == [[0.0, 0.0], [3.0, 4.0]]


def test_cache_settings_are_checked() -> None:
    from pydantic import ValidationError

    from schemas.gateway_settings import GatewaySettings

    model = {"kind": "passthrough", "name": "p", "target": "127.0.0.1:1"}
    s = GatewaySettings(models=[model], cache={"max_bytes": 1024, "topics": ["a"]})
    assert s.cache.max_bytes == 1024 and s.coalesce.max_delay_ms == 2.0
    with pytest.raises(ValidationError, match="max_bytes"):
        GatewaySettings(models=[model], cache={"max_bytes": -1})
    with pytest.raises(ValidationError, match="nothing keeps the cache fresh"):
        GatewaySettings(models=[model], cache={"max_bytes": 1, "topics": [], "hps_topic_pattern": None})


@pytest.mark.integration
async def test_unreachable_stream_turns_the_cache_off(demo_artifacts: Any, demo_backends: Any) -> None:
    model = embedding_model(demo_artifacts, demo_backends.target)
    cache = {"max_bytes": 1 << 20, "bootstrap_servers": f"127.0.0.1:{free_port()}", "max_lag_s": 1}
    async with app_client(models=[model], cache=cache) as client:
        body = json.dumps({"instances": demo_artifacts.instances[:2]})
        r = await client.post(f"/v1/models/{model['name']}:predict", content=body)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 30
        while True:
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text  # the cache is an optimisation: still ready
            status = ready.json()["cache"]["models"][demo_artifacts.manifest.model_name]
            assert status["serving"] is False, status
            if status["reason"].startswith("delta stream failed: "):
                break
            assert time.monotonic() < deadline, f"the stream never reported the dead broker: {status}"
            await asyncio.sleep(0.05)
        metrics = (await client.get("/metrics")).text
        assert 'embedgate_cache_serving{model="demo"} 0.0' in metrics


def test_no_message_stops_the_cache_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hostile message of the decoders' corpus is skipped as invalid; an exception other than DeltaError out of
    the decoding (a decoder bug) skips that record too, and the good record behind it is applied."""
    import gateway.stream as stream_module
    from tests.schemas.delta_fuzz import hostile_corpus

    stream, cache = _stream()
    cache.set_serving(True)
    cache.fill(cache.begin_read(), "t", np.array([1]), np.zeros((1, 2), dtype=np.float32))

    class _Rec:
        partition, offset, key, timestamp = 0, 0, None, 0

        def __init__(
            self, value: bytes | None, topic: str = "embedgate.deltas", key: bytes | None = None
        ) -> None:
            self.value, self.topic, self.key = value, topic, key

    for msg, _ in hostile_corpus():
        stream._apply(_Rec(msg.value, msg.topic if msg.hps else "embedgate.deltas", msg.key))
    assert stream.applied == 0

    good = EmbeddingDelta(model="m", table="t", op="upsert", ids=[1], values=[[1.0, 2.0]], timestamp_ms=1)
    real = stream_module.decode_delta

    def crashing(value: bytes | None) -> EmbeddingDelta:
        if value == b"poison":
            raise RecursionError("maximum recursion depth exceeded")
        return real(value)

    monkeypatch.setattr(stream_module, "decode_delta", crashing)
    stream._apply(_Rec(b"poison"))
    stream._apply(_Rec(encode_delta(good)))
    mask, rows = cache.get("t", np.array([1]))
    assert mask.tolist() == [True] and rows.tolist() == [[1.0, 2.0]]
    assert stream.applied == 1
