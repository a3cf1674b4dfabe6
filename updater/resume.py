"""Where a partition without a committed offset starts: at the stream position its PS replicas report.

A consumer group that never committed on a partition (a new deployment, a new group) would start there at
``auto_offset_reset`` (``earliest``: the partition's beginning) and re-apply every row the replicas' export already
holds. Every PS table reports the position it has applied (the export's stream cut, then moved by writes;
:mod:`embedgate.export.streamcut`), so such a partition starts at the **lowest position reported by every table of
every replica of the shards it carries**: nothing any replica lacks is skipped. When a replica of those shards does
not answer, or a table of it has no position for the partition (-1: an export without a stream cut), the reset
policy applies as before. A committed offset always wins (it is where this group stopped).

:func:`seed_committed_offsets` does it before the updater joins its group: it commits that start offset for the
group on each partition of the delta topics that has none, with a group-less manual assignment, so the group's
first assignment starts there like any committed partition (seeking later, in the assignment callback, would race
with aiokafka's fetcher, which starts fetching at the reset position as soon as partitions are assigned). The
commit is refused by the broker while the group has active members; their partitions are theirs to start.

Which replicas a partition concerns: the models whose topic it is (``embedgate.deltas.<model>`` or
``hps_et.<model>.<table>``; on any other topic every configured model), and of those the shards ``s`` with
``s % P == partition`` (:func:`schemas.deltas.shard_partition`, P = the topic's partition count).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from schemas.deltas import delta_topic, shard_partition
from schemas.deployment import EmbeddingModel
from schemas.manifest import Manifest, stream_partition_key
from updater.errors import ApplyError
from updater.replicas import Replica

__all__ = ["concerned_replicas", "replica_start_offsets", "seed_committed_offsets", "topic_partitions"]

log = logging.getLogger("embedgate.updater")

Positions = dict[
    str, dict[str, int]
]  # table -> {"<topic>:<partition>": next offset}, as stream_position answers


def concerned_replicas(
    topic: str, partition: int, partitions: int, models: Mapping[str, tuple[EmbeddingModel, Manifest]]
) -> list[Replica]:
    """The replicas whose rows travel on ``topic``[``partition``] (a topic of ``partitions`` partitions). Pure."""
    own = [m for m in models if topic == delta_topic(m) or topic.startswith(f"hps_et.{m}.")]
    out: list[Replica] = []
    for name in own or list(models):
        config, manifest = models[name]
        for shard in range(manifest.num_shards):
            if shard_partition(shard, partitions) == partition:
                out.extend(Replica(t, name, shard) for t in config.shards[shard].replicas)
    return out


async def replica_start_offsets(
    uncommitted: Sequence[TopicPartition],
    *,
    partitions: Callable[[str], int],
    models: Mapping[str, tuple[EmbeddingModel, Manifest]],
    position: Callable[[Replica], Awaitable[Positions]],
) -> dict[TopicPartition, int]:
    """``{tp: offset}`` for each of ``uncommitted`` (partitions without a committed offset) whose concerned replicas
    all report a position (module doc); the others are left out. ``partitions(topic)`` = its partition count (0:
    unknown); ``position(replica)`` = its ``stream_position`` (``ApplyError`` when it does not answer)."""
    concerned: dict[TopicPartition, list[Replica]] = {}
    for tp in uncommitted:
        count = partitions(tp.topic)
        if count > 0:
            concerned[tp] = concerned_replicas(tp.topic, tp.partition, count, models)
    asked = sorted({r for rs in concerned.values() for r in rs})
    answers = await asyncio.gather(*(position(r) for r in asked), return_exceptions=True)
    reports: dict[Replica, Positions] = {}
    for replica, answer in zip(asked, answers, strict=True):
        if isinstance(answer, ApplyError):
            log.info("stream_position of %s: %s; its partitions start by auto_offset_reset", replica, answer)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            reports[replica] = answer
    out: dict[TopicPartition, int] = {}
    for tp, replicas in concerned.items():
        key = stream_partition_key(tp.topic, tp.partition)
        lowest: int | None = None
        for r in replicas:
            if r not in reports:
                lowest = -1
                break
            tables = models[r.model][1].tables
            pos = min(reports[r].get(t.name, {}).get(key, -1) for t in tables)
            lowest = pos if lowest is None else min(lowest, pos)
        if lowest is not None and lowest >= 0:
            out[tp] = lowest
            log.info(
                "%s[%d]: no committed offset; starting at %d, the lowest stream position its %d replicas report",
                tp.topic,
                tp.partition,
                lowest,
                len(replicas),
            )
    return out


async def seed_committed_offsets(
    *,
    bootstrap_servers: str,
    group_id: str,
    client_id: str,
    topics: Sequence[str],
    models: Mapping[str, tuple[EmbeddingModel, Manifest]],
    position: Callable[[Replica], Awaitable[Positions]],
    kafka_kwargs: Mapping[str, Any],
) -> dict[TopicPartition, int]:
    """Commit, for ``group_id``, the replicas' start offset of every partition of ``topics`` without a committed
    offset (module doc); returns what was committed. Topics that do not exist are skipped. A refused commit (the
    group has active members) is logged and leaves the partitions to the reset policy. Raises ``KafkaError`` when
    Kafka cannot be reached."""
    counts = await topic_partitions(bootstrap_servers, f"{client_id}-seed", topics, kafka_kwargs)
    tps = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
    if not tps:
        return {}
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=group_id,
        client_id=f"{client_id}-seed",
        enable_auto_commit=False,
        **kafka_kwargs,
    )
    try:
        await consumer.start()
        consumer.assign(tps)  # manual: no group membership, only the group's committed offsets
        uncommitted = [tp for tp in tps if await consumer.committed(tp) is None]
        starts = await replica_start_offsets(
            uncommitted, partitions=lambda t: counts.get(t, 0), models=models, position=position
        )
        if not starts:
            return {}
        try:
            await consumer.commit(dict(starts))
        except KafkaError as exc:
            log.warning(
                "group %s: cannot commit the replicas' start offsets (%r); those partitions start by "
                "auto_offset_reset",
                group_id,
                exc,
            )
            return {}
        return starts
    finally:
        await consumer.stop()


async def topic_partitions(
    bootstrap_servers: str, client_id: str, topics: Sequence[str], kafka_kwargs: Mapping[str, Any]
) -> dict[str, int]:
    """``{topic: partition count}`` of those of ``topics`` that exist (never creates one)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id=client_id, **kafka_kwargs)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        present = [t for t in dict.fromkeys(topics) if t in existing]
        described = await admin.describe_topics(present) if present else []
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described if not d["error_code"]}
