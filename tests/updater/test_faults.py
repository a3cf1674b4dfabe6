"""The broker SIGKILLed mid-stream and restarted on its data, while the producer streams and the updater (its own
process) applies: every key ends at the newest value the broker acknowledged, on every replica.

Real parts only: a broker of this test's own (``tests.support.kafka.restartable_broker``: same data dir, client port
and cluster id after the restart), the session's serve-local PS replicas (shard 1 on two servers), ``embedgate
updater`` as a subprocess, ``DeltaPublisher`` as the trainer. Only acknowledged publishes count as published: a
publish in flight when the broker dies is acknowledged after the restart or fails, and a failed one is published
again until it is acknowledged. Every attempt carries a strictly newer producer timestamp, so a late copy of a
failed attempt can never win over what followed it.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from aiokafka.errors import KafkaError

from schemas.manifest import Manifest, ps_model_name
from schemas.partition import shard_for
from tests.support.kafka import RestartableBroker, restartable_broker
from tests.support.stack import ps_lookup, run_updater
from tests.updater.conftest import PsCluster
from tests.updater.harness import eventually, updater_settings
from updater.producer import DeltaPublisher

pytestmark = pytest.mark.integration

DEFAULT = -1.0  # the item table's default_value: what a deleted (or never written) key reads


async def _rows(cluster: PsCluster, ids: np.ndarray) -> list[np.ndarray]:
    """Item rows of ``ids`` as each replica holds them: one array per replica index (shard 0 has one replica, read
    twice; shard 1 has two)."""
    m = cluster.manifest
    shards = shard_for(ids, m.num_shards)
    out = []
    for replica in range(2):
        view = np.full((len(ids), m.table("item").dim), np.nan, np.float32)
        for s in range(m.num_shards):
            targets = cluster.replicas(s)
            mask = shards == s
            view[mask] = await asyncio.to_thread(
                ps_lookup,
                targets[min(replica, len(targets) - 1)],
                ps_model_name(m.model_name, s),
                m,
                "item",
                ids[mask],
            )
        out.append(view)
    return out


class AckedPublisher:
    """Publishes one step at a time and returns only once the broker acknowledged all of it. A step whose publish
    fails (aiokafka gives up on a batch after its ``request_timeout_ms``, or cannot start while the broker is down) is
    published again, with a newer timestamp, until ``step_timeout_s`` (then ``AssertionError``). The producer
    reconnects by itself; a new one is made only when starting one failed."""

    def __init__(
        self, bootstrap: str, topic: str, manifest: Manifest, *, step_timeout_s: float = 240.0
    ) -> None:
        self.bootstrap, self.topic, self.manifest = bootstrap, topic, manifest
        self.step_timeout_s = step_timeout_s
        self.failures = 0
        self._pub: DeltaPublisher | None = None
        self._last_ts = 0

    def _timestamp(self) -> int:
        self._last_ts = max(int(time.time() * 1000), self._last_ts + 1)
        return self._last_ts

    async def publish(self, ids: np.ndarray, values: np.ndarray | None) -> None:
        deadline = time.monotonic() + self.step_timeout_s
        while True:
            try:
                if self._pub is None:
                    pub = DeltaPublisher(self.bootstrap, topic=self.topic, max_rows_per_message=16)
                    await pub.start()  # stops its client itself when it fails
                    self._pub = pub
                await self._pub.publish(
                    self.manifest, "item", ids, values, delete=values is None, timestamp_ms=self._timestamp()
                )
                return
            except KafkaError as exc:
                self.failures += 1
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"a publish was not acknowledged within {self.step_timeout_s} s: {exc!r}"
                    ) from exc
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        if self._pub is not None:
            await self._pub.stop()


@pytest.mark.timeout(600)  # a broker restart plus catching up; every wait inside is bounded on its own
async def test_broker_sigkilled_and_restarted_on_its_data_mid_stream_loses_nothing(
    ps_cluster: PsCluster, unique: str, tmp_path: Path
) -> None:
    """40 steps of random upserts (and every 6th step deletes) over 240 keys, then a sweep giving every key its final
    value; the broker is SIGKILLed right after step 12 (while steps 13.. are being published) and restarted on its
    data dir. The updater process keeps running throughout. Every key must end at its newest acknowledged value (or
    the default row after a delete), on every replica, and nothing may be dead-lettered."""
    keys = np.arange(17000, 17240, dtype=np.int64)
    rng = random.Random(11)
    expected: dict[int, list[float] | None] = {}
    outage: dict[str, float] = {}

    with restartable_broker(tmp_path / "kafka") as broker:
        s = updater_settings(broker.broker, ps_cluster, unique, batch={"max_messages": 8, "max_delay_ms": 5})
        publisher = AckedPublisher(broker.bootstrap, s["topics"][0], ps_cluster.manifest)

        async def crash_and_restart(b: RestartableBroker) -> None:
            outage["killed_status"] = await asyncio.to_thread(b.kill)
            outage["killed_at"] = time.monotonic()
            await asyncio.to_thread(b.restart)
            outage["back_at"] = time.monotonic()

        async def step(j: int, ids: np.ndarray, delete: bool) -> None:
            if delete:
                await publisher.publish(ids, None)
                expected.update(dict.fromkeys(ids.tolist()))
                return
            vals = np.stack([np.full(len(ids), j), ids, np.arange(len(ids)), np.ones(len(ids))], 1)
            vals = vals.astype(np.float32)
            await publisher.publish(ids, vals)
            expected.update(zip(ids.tolist(), vals.tolist(), strict=True))

        async def applied_step(at_least: int) -> bool:
            views = await _rows(ps_cluster, keys)
            return bool((np.concatenate(views)[:, 0] >= at_least).any())

        with run_updater(s, tmp_path, tag="updater") as upd:
            crash: asyncio.Task[None] | None = None
            spans: list[tuple[float, float]] = []  # (start, acknowledged) of each step
            try:
                for j in range(40):
                    chosen = keys[sorted(rng.sample(range(len(keys)), 100))]
                    delete = j % 6 == 5
                    t0 = time.monotonic()
                    await step(j, chosen[:25] if delete else chosen, delete)
                    spans.append((t0, time.monotonic()))
                    if j == 12:
                        await eventually(
                            lambda: applied_step(8),
                            timeout_s=90,
                            what="the updater applying before the crash",
                        )
                        crash = asyncio.create_task(crash_and_restart(broker))
                    await asyncio.sleep(0.05)
                assert crash is not None
                await asyncio.wait_for(crash, 180)
                for j, part in enumerate(np.array_split(keys, 6)):  # the sweep: every key's final value
                    await step(100 + j, part, delete=j == 2)
            finally:
                await publisher.close()
                if crash is not None and not crash.done():
                    crash.cancel()

            assert outage["killed_status"] == -signal.SIGKILL
            assert broker.restarts == 1
            in_flight = [sp for sp in spans if sp[0] < outage["back_at"] and sp[1] > outage["killed_at"]]
            assert in_flight, "no publish was in flight while the broker was down: the test missed the crash"
            want = np.array([expected.get(k) or [DEFAULT] * 4 for k in keys.tolist()], np.float32)

            async def converged() -> bool:
                upd.check_alive()  # the updater must ride out the broker's crash by itself
                return all(np.array_equal(v, want) for v in await _rows(ps_cluster, keys))

            await eventually(converged, timeout_s=120, what="every key at its newest acknowledged value")
            for replica, view in enumerate(await _rows(ps_cluster, keys)):
                for k, got, row in zip(keys.tolist(), view.tolist(), want.tolist(), strict=True):
                    assert got == row, f"replica {replica}, key {k}: PS has {got}, newest acknowledged {row}"
            upd.check_alive()
            assert upd.metric("embedgate_updater_dead_letters_total") == 0, "valid rows were dead-lettered"
