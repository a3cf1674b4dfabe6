"""The broker SIGKILLed and restarted on its data, twice, while the producer streams and the updater (its own process)
applies: every key ends at the newest value the broker acknowledged, on every replica.

Real parts only: a broker of this test's own (``tests.support.kafka.restartable_broker``: same data dir, client port
and cluster id after a restart), the session's serve-local PS replicas (shard 1 on two servers), ``embedgate
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
from tests.support.kafka import restartable_broker
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


@pytest.mark.timeout(600)  # two broker restarts plus catching up; every wait inside is bounded on its own
async def test_broker_sigkilled_and_restarted_on_its_data_mid_stream_loses_nothing(
    ps_cluster: PsCluster, unique: str, tmp_path: Path
) -> None:
    """The broker is SIGKILLed and restarted on its data twice while the updater process runs:

    1. mid-stream: 30 steps of random upserts (every 6th step deletes) over 240 keys; the broker dies right after step
       12, while steps 13.. are being published and the updater is applying; then every key must be at its newest
       acknowledged value;
    2. with acknowledged rows not yet applied: the updater is paused (SIGSTOP) while the first half of a sweep giving
       every key its final value is published and acknowledged; the broker is SIGKILLed, the updater continues
       (SIGCONT) and the second half is published during the outage. The first half can reach the PS only from the
       restarted broker's log.

    Every key must end at its newest acknowledged value (or the default row after a delete), on every replica, and
    nothing may be dead-lettered."""
    keys = np.arange(17000, 17240, dtype=np.int64)
    rng = random.Random(11)
    expected: dict[int, list[float] | None] = {}
    outages: dict[int, dict[str, float]] = {1: {}, 2: {}}

    with restartable_broker(tmp_path / "kafka") as broker:
        s = updater_settings(broker.broker, ps_cluster, unique, batch={"max_messages": 8, "max_delay_ms": 5})
        publisher = AckedPublisher(broker.bootstrap, s["topics"][0], ps_cluster.manifest)

        async def crash_and_restart(n: int) -> None:
            outages[n]["killed_status"] = await asyncio.to_thread(broker.kill)
            outages[n]["killed_at"] = time.monotonic()
            await asyncio.to_thread(broker.restart)
            outages[n]["back_at"] = time.monotonic()

        spans: list[tuple[float, float]] = []  # (start, acknowledged) of each publish

        async def step(j: int, ids: np.ndarray, delete: bool) -> None:
            t0 = time.monotonic()
            if delete:
                await publisher.publish(ids, None)
                expected.update(dict.fromkeys(ids.tolist()))
            else:
                vals = np.stack([np.full(len(ids), j), ids, np.arange(len(ids)), np.ones(len(ids))], 1)
                vals = vals.astype(np.float32)
                await publisher.publish(ids, vals)
                expected.update(zip(ids.tolist(), vals.tolist(), strict=True))
            spans.append((t0, time.monotonic()))

        def wanted(ids: np.ndarray) -> np.ndarray:
            return np.array([expected.get(k) or [DEFAULT] * 4 for k in ids.tolist()], np.float32)

        async def at_newest(ids: np.ndarray) -> bool:
            want = wanted(ids)
            return all(np.array_equal(v, want) for v in await _rows(ps_cluster, ids))

        async def applied_step(at_least: int) -> bool:
            return bool((np.concatenate(await _rows(ps_cluster, keys))[:, 0] >= at_least).any())

        with run_updater(s, tmp_path, tag="updater") as upd:
            tasks: list[asyncio.Task[None]] = []
            try:
                # 1. the broker dies while steps are published and applied
                for j in range(30):
                    chosen = keys[sorted(rng.sample(range(len(keys)), 100))]
                    delete = j % 6 == 5
                    await step(j, chosen[:25] if delete else chosen, delete)
                    if j == 12:
                        await eventually(
                            lambda: applied_step(8), timeout_s=90, what="the updater applying before crash 1"
                        )
                        tasks.append(asyncio.create_task(crash_and_restart(1)))
                    await asyncio.sleep(0.05)
                await asyncio.wait_for(tasks[0], 180)
                await eventually(
                    lambda: at_newest(keys), timeout_s=120, what="every key at its newest value after crash 1"
                )

                # 2. acknowledged, not applied, then the broker dies
                sweep = np.array_split(keys, 6)
                upd.proc.send_signal(signal.SIGSTOP)
                try:
                    for i in range(3):
                        await step(100 + i, sweep[i], delete=i == 1)
                    assert not await at_newest(sweep[0]), "the paused updater applied rows"
                    tasks.append(asyncio.create_task(crash_and_restart(2)))

                    async def killed() -> bool:
                        if tasks[1].done():
                            tasks[1].result()  # raise what the crash task raised
                        return "killed_at" in outages[2]

                    await eventually(killed, what="broker SIGKILLed (crash 2)")
                finally:
                    upd.proc.send_signal(signal.SIGCONT)
                for i in range(3, 6):  # in flight while the broker is down
                    await step(100 + i, sweep[i], delete=False)
                await asyncio.wait_for(tasks[1], 180)
            finally:
                await publisher.close()
                for t in tasks:
                    t.cancel()

            assert broker.restarts == 2
            for n, outage in outages.items():
                assert outage["killed_status"] == -signal.SIGKILL
                in_flight = [sp for sp in spans if sp[0] < outage["back_at"] and sp[1] > outage["killed_at"]]
                assert in_flight, f"no publish was in flight while the broker was down (crash {n})"

            async def converged() -> bool:
                upd.check_alive()  # the updater must ride out the broker's crashes by itself
                return await at_newest(keys)

            await eventually(converged, timeout_s=120, what="every key at its newest acknowledged value")
            want = wanted(keys)
            for replica, view in enumerate(await _rows(ps_cluster, keys)):
                for k, got, row in zip(keys.tolist(), view.tolist(), want.tolist(), strict=True):
                    assert got == row, f"replica {replica}, key {k}: PS has {got}, newest acknowledged {row}"
            upd.check_alive()
            assert upd.metric("embedgate_updater_dead_letters_total") == 0, "valid rows were dead-lettered"
