"""End to end: a published embedding changes the prediction served by the gateway's REST predict.

Real everything: the small demo model on its own serve-local (so the shared ``demo_backends`` stays untouched), the
gateway as a subprocess, the updater in this event loop, the session's Kafka broker.
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
from tests.updater.harness import demo_row, predict_one, running, updater_settings
from updater.producer import DeltaPublisher

pytestmark = pytest.mark.integration


async def test_published_embedding_changes_gateway_prediction(
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
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"models": [model]}))
        gw = await asyncio.to_thread(stack.enter_context, run_gateway(cfg))
        url = f"{gw.url}/v1/models/{name}:predict"
        s = updater_settings(kafka, None, unique, models=[model])  # type: ignore[arg-type]
        async with httpx.AsyncClient(timeout=10) as client, running(s):
            before = await predict_one(client, url, instance)
            async with DeltaPublisher(kafka.bootstrap, topic=s["topics"][0]) as pub:
                await pub.publish(manifest, table.name, [the_id], np.full((1, table.dim), 3.0, np.float32))
            deadline = time.monotonic() + 20
            after = before
            while np.allclose(after, before) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                after = await predict_one(client, url, instance)
        # no wall-clock bound here (shared machines): freshness is measured by benchmarks.updater_bench
        assert not np.allclose(after, before), (
            f"prediction did not change within 20 s of publishing {table.name}[{the_id}]"
        )
