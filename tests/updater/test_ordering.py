"""Newest wins per row, enforced in the PS: producers racing with reversed timestamps, late deletes and replays all
converge to the value with the highest (timestamp, sequence) per key (real Kafka, real serve-local replicas)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from schemas.partition import shard_for
from tests.support.kafka import Broker
from tests.updater.conftest import PsCluster
from tests.updater.harness import eventually, running, updater_settings
from tests.updater.psmodel import lookup
from updater.producer import DeltaPublisher

pytestmark = pytest.mark.integration

DEFAULT = -1.0


async def _views(cluster: PsCluster, ids: np.ndarray) -> list[np.ndarray]:
    shards = shard_for(ids, 2)
    out = []
    for replica in range(2):
        view = np.full((len(ids), 4), np.nan, np.float32)
        for s in (0, 1):
            targets = cluster.replicas(s)
            mask = shards == s
            view[mask] = await asyncio.to_thread(
                lookup,
                targets[min(replica, len(targets) - 1)],
                f"emb_ps_{s}",
                cluster.manifest,
                "item",
                ids[mask],
            )
        out.append(view)
    return out


async def test_two_producers_racing_with_reversed_timestamps_converge_to_the_newest(
    kafka: Broker, ps_cluster: PsCluster, unique: str
) -> None:
    """Trainer A publishes newer rows first; trainer B then publishes older rows (and older deletes) of the same keys,
    so B's messages come later in every partition. Log order would let B win; the PS keeps A's, key by key."""
    s = updater_settings(kafka, ps_cluster, unique, batch={"max_messages": 4, "max_delay_ms": 5})
    keys = np.arange(12000, 12200, dtype=np.int64)
    half = keys[:100]
    newer = np.stack([keys, np.full(200, 2.0), np.zeros(200), np.ones(200)], 1).astype(np.float32)
    older = np.stack([keys, np.full(200, 1.0), np.zeros(200), np.ones(200)], 1).astype(np.float32)
    base_ts = 1_800_000_000_000
    async with (
        DeltaPublisher(kafka.bootstrap, topic=s["topics"][0], producer_id="A", max_rows_per_message=16) as a,
        DeltaPublisher(kafka.bootstrap, topic=s["topics"][0], producer_id="B", max_rows_per_message=16) as b,
    ):
        await a.publish(ps_cluster.manifest, "item", keys, newer, timestamp_ms=base_ts + 1000)
        await b.publish(ps_cluster.manifest, "item", keys, older, timestamp_ms=base_ts)
        await b.publish(ps_cluster.manifest, "item", half, delete=True, timestamp_ms=base_ts + 500)
        # a later delete by A of 20 keys does remove them; an even older upsert by B after it cannot resurrect them
        await a.publish(ps_cluster.manifest, "item", keys[180:], delete=True, timestamp_ms=base_ts + 2000)
        await b.publish(ps_cluster.manifest, "item", keys[180:], older[180:], timestamp_ms=base_ts + 1500)
    want = newer.copy()
    want[180:] = DEFAULT
    async with running(s):

        async def converged() -> bool:
            return all(np.array_equal(v, want) for v in await _views(ps_cluster, keys))

        await eventually(converged, timeout_s=60, what="the newest value of every key")
    for view in await _views(ps_cluster, keys):
        for k, got, row in zip(keys.tolist(), view.tolist(), want.tolist(), strict=True):
            assert got == row, f"key {k}: PS has {got}, newest published {row}"

    # a replay of everything changes nothing: older rows never win. (A new group alone would start where the replicas
    # report they are, past every row here: updater/resume.py; so the replay is asked for explicitly.)
    again = updater_settings(
        kafka, ps_cluster, unique, group_id=f"{unique}-replay", replay_since="1970-01-01T00:00:00Z"
    )
    async with running(again) as upd:

        async def replayed() -> bool:  # every key's newest op (upsert or delete) was written again
            def rows(op: str) -> float:
                labels = {"model": "emb", "table": "item", "op": op}
                return (
                    upd.metrics.registry.get_sample_value("embedgate_updater_rows_applied_total", labels) or 0
                )

            return rows("upsert") + rows("delete") >= 200

        await eventually(replayed, what="the replay applied")
        for view in await _views(ps_cluster, keys):
            assert np.array_equal(view, want), "a replay of older rows changed the PS"
