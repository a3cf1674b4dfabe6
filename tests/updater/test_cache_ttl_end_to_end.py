"""The gateway's hot-row cache drops rows the PS expired (``ttl_s``): after the updater's ``expire`` removed a row the
gateway had cached, the next predict answers what the PS holds (the default row), not the cached row.

Real everything: the tiny export model with ``ttl_s`` on ``user_emb`` (a few seconds), serve-local (entry + 2 PS
shards), the session's Kafka broker, the updater in this event loop calling ``expire`` on a short schedule, and the
gateway as a subprocess with the cache on (``cache.expiry_margin_s: 0``: one machine, one clock). Without the
cache's expiry the last predict would still answer the published row from the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.export.conftest import DECLARATION, build_tiny_model, tiny_instances
from tests.support.kafka import Broker
from tests.updater.harness import running, updater_settings
from tests.updater.test_cache_end_to_end import _metric, _until
from updater.producer import DeltaPublisher

pytestmark = pytest.mark.integration

# Long enough that the row cannot expire between its write and the two predicts that show it cached, on a loaded
# machine; the test waits about this long for the expiry.
TTL_S = 10.0


async def _predict(client: httpx.AsyncClient, url: str, instances: list[dict[str, Any]]) -> np.ndarray:
    r = await client.post(url, content=json.dumps({"instances": instances}))
    assert r.status_code == 200, r.text
    return np.asarray([p["score"] for p in r.json()["predictions"]], np.float64)


async def test_a_cached_row_that_the_ps_expired_is_not_served(
    kafka: Broker, tmp_path: Path, unique: str
) -> None:
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model
    from schemas.manifest import ps_model_name
    from schemas.partition import shard_for
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import embedding_model, exported_backends, ps_lookup

    decl = dict(DECLARATION)
    decl["tables"] = {**DECLARATION["tables"], "user_emb": {"ttl_s": TTL_S}}  # type: ignore[dict-item]
    result = export_model(
        build_tiny_model(), Declaration.model_validate(decl), tmp_path / "out", num_shards=2, self_check=False
    )
    manifest = result.manifest
    assert manifest.exported_at_ms is not None
    user = manifest.table("user_emb")
    instance = tiny_instances()[0]
    the_id, other_id = (
        int(instance["user"]),
        7,
    )  # other_id: exported, never published (expires with the export)
    shard = ps_model_name("tiny", int(shard_for(np.asarray([the_id]), 2)[0]))

    with contextlib.ExitStack() as stack:
        server = await asyncio.to_thread(
            stack.enter_context, serve_local(exported_backends(result.model_dir))
        )
        model = embedding_model(result.model_dir, entry=server.target, shards=[[server.target]] * 2)
        s = updater_settings(kafka, None, unique, models=[model], expire_interval_s=0.3)
        cache = {
            "max_bytes": 1 << 20,
            "bootstrap_servers": kafka.bootstrap,
            "topics": s["topics"],
            "hps_topic_pattern": None,
            "settle_s": 0.0,
            "expiry_margin_s": 0.0,
        }
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": [model], "cache": cache}))
        async with httpx.AsyncClient(timeout=10) as client, running(s):
            gw = await asyncio.to_thread(stack.enter_context, run_gateway(cfg))
            url = f"{gw.url}/v1/models/tiny:predict"

            async def serving() -> bool:
                doc = (await client.get(f"{gw.url}/readyz")).json()
                return bool(doc.get("cache", {}).get("models", {}).get("tiny", {}).get("serving"))

            await _until("the gateway's cache serves (stream caught up)", serving)
            async with DeltaPublisher(kafka.bootstrap, topic=s["topics"][0]) as pub:
                await pub.publish(manifest, user.name, [the_id], np.full((1, user.dim), 3.0, np.float32))

            async def in_ps() -> bool:
                rows = await asyncio.to_thread(ps_lookup, server.target, shard, manifest, user.name, [the_id])
                return bool(np.all(rows == 3.0))

            await _until("the updater wrote the published row", in_ps)
            fresh = await _predict(client, url, [instance])
            hits = await _metric(client, gw.url, "embedgate_cache_hits_total")
            np.testing.assert_allclose(await _predict(client, url, [instance]), fresh)
            assert await _metric(client, gw.url, "embedgate_cache_hits_total") > hits, (
                "the row was not cached"
            )

            async def expired_in_ps() -> bool:
                rows = await asyncio.to_thread(ps_lookup, server.target, shard, manifest, user.name, [the_id])
                return bool(np.all(rows == user.default_value))

            await _until("the updater's expire removed the row from the PS", expired_in_ps, timeout_s=60)
            after = await _predict(client, url, [instance])  # the very next predict, no retry
            gone = await _predict(client, url, [{**instance, "user": other_id}])  # another expired id
            np.testing.assert_allclose(after, gone)
            assert not np.allclose(after, fresh), "the cache served a row that the PS had expired"
            assert await _metric(client, gw.url, "embedgate_cache_expired_total") >= 1
