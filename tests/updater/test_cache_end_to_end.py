"""The gateway's hot-row cache stays fresh: once the gateway's stream consumer saw a published row, the next predict
reflects it, although the row was cached (and is answered without a PS lookup).

Real everything: the small demo model on its own serve-local, the session's Kafka broker, the updater in this event
loop, the gateway as a subprocess with ``cache.max_bytes`` > 0 on the updater's topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.support.kafka import Broker
from tests.support.stack import metric_sum
from tests.updater.harness import demo_row, predict_one, running, updater_settings
from updater.producer import DeltaPublisher

pytestmark = pytest.mark.integration


async def _metric(client: httpx.AsyncClient, base: str, name: str) -> float:
    return metric_sum((await client.get(f"{base}/metrics")).text, name)


async def _until(what: str, check: Any, timeout_s: float = 30.0) -> None:
    """Poll ``check()`` (async, truthy when done) every 50 ms; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting until {what}")
        await asyncio.sleep(0.05)


async def test_cached_row_reflects_a_published_delta_on_the_next_predict(
    kafka: Broker, demo_artifacts: Any, tmp_path: Path, unique: str
) -> None:
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import embedding_model, exported_backends

    row = demo_row(demo_artifacts)
    manifest, table, instance, the_id = row.manifest, row.table, row.instance, row.the_id
    name = manifest.model_name
    served = exported_backends(demo_artifacts.model_dir)

    with contextlib.ExitStack() as stack:
        server = await asyncio.to_thread(stack.enter_context, serve_local(served))
        model = embedding_model(
            demo_artifacts.model_dir, entry=server.target, shards=[[server.target]] * manifest.num_shards
        )
        s = updater_settings(kafka, None, unique, models=[model])  # type: ignore[arg-type]
        cache = {
            "max_bytes": 1 << 20,
            "bootstrap_servers": kafka.bootstrap,
            "topics": s["topics"],
            "hps_topic_pattern": None,
            "settle_s": 0.0,
        }
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": [model], "cache": cache}))
        async with httpx.AsyncClient(timeout=10) as client, running(s):  # the updater creates the topic
            gw = await asyncio.to_thread(stack.enter_context, run_gateway(cfg))
            url = f"{gw.url}/v1/models/{name}:predict"

            async def serving() -> bool:
                doc = (await client.get(f"{gw.url}/readyz")).json()
                return bool(doc.get("cache", {}).get("models", {}).get(name, {}).get("serving"))

            await _until("the gateway's cache serves (stream caught up)", serving)
            before = await predict_one(client, url, instance)
            hits_before = await _metric(client, gw.url, "embedgate_cache_hits_total")
            again = await predict_one(client, url, instance)
            np.testing.assert_allclose(again, before)
            assert await _metric(client, gw.url, "embedgate_cache_hits_total") > hits_before, (
                "second predict missed"
            )

            applied = await _metric(client, gw.url, "embedgate_cache_deltas_total")
            async with DeltaPublisher(kafka.bootstrap, topic=s["topics"][0]) as pub:
                await pub.publish(manifest, table.name, [the_id], np.full((1, table.dim), 3.0, np.float32))

            async def seen() -> bool:
                return await _metric(client, gw.url, "embedgate_cache_deltas_total") > applied

            await _until("the gateway's stream consumer saw the delta", seen)
            after = await predict_one(client, url, instance)  # the very next predict, no retry
            assert not np.allclose(after, before), (
                "a cached row did not reflect the delta the gateway had seen"
            )
            doc = (await client.get(f"{gw.url}/readyz")).json()
            assert doc["status"] == "ready" and doc["cache"]["models"][name]["serving"] is True
