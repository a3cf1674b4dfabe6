"""The Kafka stream cut a snapshot contains: ``"<topic>:<partition>"`` -> the next offset it does not hold.

An export records it in every PS table (its starting stream position, :func:`embedgate.export.ps.write_ps_shard`)
and in ``manifest.json`` (``stream_cut``), so an updater resumes a freshly loaded replica from the cut instead of
replaying the partition from its beginning.

The contract: **every row published before the cut is in the snapshot**. Rows published after it are replayed onto
the snapshot (harmless: rows are absolute and versioned); a row published before the cut but missing from the
snapshot is never replayed. So read the cut (:func:`kafka_stream_cut`) after the trainer's publishes were
acknowledged (``DeltaPublisher.publish`` and ``embedgate publish`` return only then) and after its tables hold those
rows, and before it publishes anything the snapshot will not hold: a cut read too early only costs a longer replay,
a cut read too late loses rows.

:func:`parse_stream_cut` reads the command-line form ``<topic>:<partition>=<offset>,...``; :func:`format_stream_cut`
writes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from schemas.manifest import stream_partition_key
from schemas.tls import KafkaSecurity

__all__ = ["StreamCutError", "format_stream_cut", "kafka_stream_cut", "parse_stream_cut", "read_stream_cut"]


class StreamCutError(ValueError):
    """A stream cut that cannot be read; the message names the offending item."""


def parse_stream_cut(text: str) -> dict[str, int]:
    """``"t:0=12,t:1=7"`` -> ``{"t:0": 12, "t:1": 7}`` (a topic may contain ``:``; the last one splits off the
    partition). Raises :class:`StreamCutError` naming the first bad item."""
    out: dict[str, int] = {}
    for raw in text.split(","):
        item = raw.strip()
        key, eq, offset = item.rpartition("=")
        topic, colon, part = key.strip().rpartition(":")
        if not (eq and colon and topic.strip() and part.isdigit() and offset.strip().isdigit()):
            raise StreamCutError(f"stream cut item {item!r}: expected <topic>:<partition>=<offset>")
        k = stream_partition_key(topic.strip(), int(part))
        if k in out:
            raise StreamCutError(f"stream cut item {item!r}: partition {k} is given twice")
        out[k] = int(offset)
    return out


def format_stream_cut(cut: Mapping[str, int]) -> str:
    """The command-line form of ``cut`` (sorted), as :func:`parse_stream_cut` reads it; ``""`` when empty."""
    return ",".join(f"{k}={v}" for k, v in sorted(cut.items()))


async def read_stream_cut(
    bootstrap_servers: str, topics: Iterable[str], *, security: KafkaSecurity | None = None
) -> tuple[dict[str, int], list[str]]:
    """(the end offset, i.e. the next offset to be written, of every partition of ``topics``; the topics that do not
    exist: nothing was ever published to them, they add nothing to the cut). Raises aiokafka's ``KafkaError`` when
    Kafka cannot be reached, ``TLSFileError`` for unreadable security files."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from updater.kafka_security import client_kwargs

    kwargs = client_kwargs(security)
    wanted = list(dict.fromkeys(topics))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, client_id="embedgate-export", **kwargs)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t not in existing]
        described = (
            await admin.describe_topics([t for t in wanted if t in existing])
            if len(missing) < len(wanted)
            else []
        )
    finally:
        await admin.close()
    tps = sorted(TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"])
    if not tps:
        return {}, missing
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=None,
        client_id="embedgate-export",
        enable_auto_commit=False,
        **kwargs,
    )
    try:
        await consumer.start()
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {stream_partition_key(tp.topic, tp.partition): int(off) for tp, off in ends.items()}, missing


def kafka_stream_cut(
    bootstrap_servers: str,
    topics: Iterable[str],
    *,
    security: KafkaSecurity | None = None,
    timeout_s: float = 60.0,
) -> tuple[dict[str, int], list[str]]:
    """:func:`read_stream_cut` from synchronous code (not inside a running event loop); ``TimeoutError`` after
    ``timeout_s``."""
    return asyncio.run(
        asyncio.wait_for(read_stream_cut(bootstrap_servers, topics, security=security), timeout_s)
    )
