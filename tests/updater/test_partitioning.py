"""Even, checked partitioning: shard ``s`` goes to partition ``s % P``; several updaters in one group split the
shards evenly (real broker, real serve-local replicas)."""

from __future__ import annotations

import contextlib
import zlib

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.deltas import (
    EmbeddingDelta,
    decode_delta,
    delta_topic,
    encode_delta,
    shard_partition,
)
from schemas.partition import shard_for
from tests.support.kafka import Broker
from tests.updater.conftest import PsCluster
from tests.updater.harness import eventually, running, updater_settings
from updater.consumer import Updater
from updater.producer import DeltaPublisher, message_key


def test_shard_partition_is_shard_mod_partitions() -> None:
    assert [shard_partition(s, 4) for s in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [shard_partition(s, 1) for s in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        shard_partition(0, 0)


def test_delta_topic_is_per_model() -> None:
    assert delta_topic("demo") == "embedgate.deltas.demo"


@pytest.mark.integration
async def test_publisher_creates_the_model_topic_and_sends_shard_s_to_partition_s_mod_p(
    kafka: Broker, unique: str
) -> None:
    from tests.updater.test_producer import MANIFEST  # model "pemb", 3 shards

    manifest = MANIFEST.model_copy(update={"model_name": f"pemb{unique}"})
    ids = np.arange(600, dtype=np.int64)
    async with DeltaPublisher(kafka.bootstrap, topic_partitions=2) as pub:
        res = await pub.publish(manifest, "item", ids, np.ones((600, 4), np.float32))
        assert res.topic == delta_topic(manifest.model_name)
        assert await pub.partitions(res.topic) == 3, "created with max(topic_partitions, shards) partitions"
    consumer = AIOKafkaConsumer(res.topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    seen: list[tuple[int, int]] = []
    try:

        async def all_read() -> bool:
            for tp, recs in (await consumer.getmany(timeout_ms=200)).items():
                seen.extend(
                    (tp.partition, int(s)) for r in recs for s in shard_for(decode_delta(r.value).ids, 3)
                )
            return len(seen) >= 600

        await eventually(all_read, what="every published row")
    finally:
        await consumer.stop()
    assert {(p, s) for p, s in seen} == {(0, 0), (1, 1), (2, 2)}, "shard s in partition s % 3, nothing else"


@pytest.mark.integration
async def test_two_updaters_in_one_group_split_the_shards_evenly(
    kafka: Broker, ps_cluster: PsCluster, unique: str
) -> None:
    """Model ``emb`` has 2 shards; its topic gets 2 partitions. Two updaters in one group own one partition each,
    so each applies exactly one shard's rows (with key hashing both shards could land on one partition)."""
    s = updater_settings(kafka, ps_cluster, unique, topic_partitions=2)
    topic = s["topics"][0]
    ids = np.arange(9000, 9200, dtype=np.int64)
    shards = shard_for(ids, 2)
    values = np.repeat(ids[:, None], 4, axis=1).astype(np.float32)
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(running(s))
        second = await stack.enter_async_context(running(s))

        async def split() -> bool:
            return len(first.assignment()) == 1 and len(second.assignment()) == 1

        await eventually(split, what="one partition per updater")
        owned = {first: first.assignment(), second: second.assignment()}
        assert owned[first] | owned[second] == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        async with DeltaPublisher(kafka.bootstrap, topic=topic) as pub:
            await pub.publish(ps_cluster.manifest, "item", ids, values)

        def applied(upd: Updater) -> float:
            labels = {"model": "emb", "table": "item", "op": "upsert"}
            return (
                upd.metrics.registry.get_sample_value("embedgate_updater_rows_applied_total", labels) or 0.0
            )

        async def done() -> bool:
            return applied(first) + applied(second) >= len(ids)

        await eventually(done, what="every row applied")
        for upd in (first, second):
            (tp,) = owned[upd]
            assert applied(upd) == int((shards == tp.partition).sum()), (
                f"the owner of partition {tp.partition} applies exactly shard {tp.partition}'s rows"
            )


@pytest.mark.integration
async def test_a_hashing_or_scattering_producer_converges_key_by_key(
    kafka: Broker, ps_cluster: PsCluster, unique: str
) -> None:
    """Messages published as non-Java producers do: partition = CRC32(key) % P (librdkafka's default for a keyed
    message) or any partition (a keyless producer). Shards' messages spread over partitions they do not belong in and
    versions arrive out of log order; every row is versioned, so each key ends at its newest version (deletes
    included) on every replica, nothing is dead-lettered."""
    from tests.updater.test_consumer import DEFAULT, _rows, _sample

    s = updater_settings(kafka, ps_cluster, unique)  # 4 partitions, 2 shards
    topic = s["topics"][0]
    rng = np.random.default_rng(7)
    ids = np.arange(77_000, 77_120, dtype=np.int64)
    shards = shard_for(ids, 2)
    messages: list[tuple[int, bytes, bytes]] = []  # (partition, key, value)
    newest: dict[int, np.ndarray | None] = {}
    for i, id_ in enumerate(ids.tolist()):
        key = message_key("emb", int(shards[i]))
        versions = list(range(3))
        rng.shuffle(versions)  # published out of version order
        for v in versions:
            ts = 1_000 + v
            deleted = v == 2 and i % 5 == 0  # some keys end deleted
            if deleted:
                delta = EmbeddingDelta(model="emb", table="item", op="delete", ids=[id_], timestamp_ms=ts)
            else:
                row = np.full((1, 4), id_ + v / 10, np.float32)
                delta = EmbeddingDelta(
                    model="emb", table="item", op="upsert", ids=[id_], values=row, timestamp_ms=ts
                )
            if v == 2:
                newest[id_] = None if deleted else np.full(4, id_ + v / 10, np.float32)
            partition = zlib.crc32(key) % 4 if i % 2 == 0 else int(rng.integers(4))
            messages.append((partition, key, encode_delta(delta)))
    placed = [shard_partition(int(k.decode().rsplit("/", 1)[1]), 4) for _, k, _ in messages]
    assert sum(p != want for (p, _, _), want in zip(messages, placed, strict=True)) > len(messages) // 2
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        for partition, key, value in messages:
            await producer.send(topic, value, key=key, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()
    expected = np.stack(
        [np.full(4, DEFAULT, np.float32) if newest[i] is None else newest[i] for i in ids.tolist()]
    )
    async with running(s) as upd:

        async def converged() -> bool:
            return all(np.array_equal(view, expected) for view in await _rows(ps_cluster, "item", ids))

        await eventually(converged, what="every key at its newest version on every replica")
        assert _sample(upd, "embedgate_updater_misplaced_messages_total", {"model": "emb"}) > 0
        assert _sample(upd, "embedgate_updater_dead_letters_total", {"reason": "wrong_partition"}) == 0
