"""The gateway's hot-row cache picks up a delta topic created after it started (the first publish creates it), and
reads that topic from its beginning: no row published before the consumer was assigned is missed."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gateway.cache import RowCache
from gateway.stream import DeltaStream
from schemas.cache_settings import CacheSettings
from schemas.manifest import Manifest
from tests.support.kafka import Broker
from updater.producer import DeltaPublisher

pytestmark = pytest.mark.integration


def _manifest(name: str) -> Manifest:
    return Manifest.model_validate(
        {
            "model_name": name,
            "version": 1,
            "tables": [{"name": "t", "dim": 2}],
            "sparse_features": [{"name": "f", "table": "t"}],
            "partition": {"num_shards": 2},
            "entry": {"outputs": [{"name": "score", "shape": [1]}]},
        }
    )


async def test_a_topic_created_after_start_is_read_from_its_beginning(kafka: Broker, unique: str) -> None:
    manifest = _manifest(f"late{unique}")
    cache = RowCache(manifest.model_name, {"t": 2}, 1 << 20, settle_s=0)
    settings = CacheSettings(
        max_bytes=1 << 20, bootstrap_servers=kafka.bootstrap, hps_topic_pattern=None, metadata_max_age_ms=1000
    )
    stream = DeltaStream(settings, {manifest.model_name: cache}, {manifest.model_name: manifest})
    task = asyncio.create_task(stream.run())
    try:
        deadline = time.monotonic() + 60
        while cache.status().get("reason") != "no delta topic partition assigned yet":
            assert time.monotonic() < deadline, cache.status()
            await asyncio.sleep(0.1)
        async with DeltaPublisher(kafka.bootstrap) as pub:  # creates embedgate.deltas.<model>
            await pub.publish(manifest, "t", np.arange(8), np.ones((8, 2)))
        deadline = time.monotonic() + 120
        while stream.applied < 2:  # 8 ids over 2 shards: two messages
            assert time.monotonic() < deadline, f"the new topic was not picked up: {cache.status()}"
            await asyncio.sleep(0.1)
        while not cache.serving:
            assert time.monotonic() < deadline, cache.status()
            await asyncio.sleep(0.1)
    finally:
        stream.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
