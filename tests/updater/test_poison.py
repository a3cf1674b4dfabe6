"""Crash-class messages on a real broker: each is dead-lettered with its reason and the rows behind it are applied on
every replica, key by key; the updater keeps running (real Kafka, real serve-local replicas: shard 1 has two).

Before the decoders were hardened, the first of these (JSON nested 100 000 deep) raised RecursionError out of the
updater's loop: the process died before committing, and every restart died on the same record.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from schemas.deltas import DECODER_ERROR, EmbeddingDelta, encode_delta, encode_delta_json
from schemas.partition import shard_for
from tests.support.kafka import Broker
from tests.updater.conftest import PsCluster
from tests.updater.harness import eventually, running, updater_settings
from tests.updater.test_consumer import _read_all, _rows
from updater.producer import message_key

pytestmark = pytest.mark.integration

_DEEP = 100_000


def _crash_class(valid_json: bytes, valid_binary: bytes) -> list[tuple[str, bytes]]:
    """(reason, value): messages that stopped the updater, or could have, and the reason each is refused with."""
    huge_n = bytearray(valid_binary)
    struct.pack_into("<I", huge_n, 24, 2**32 - 1)  # a lying count: 4 billion ids declared
    return [
        ("invalid_json", b'{"ids":' + b"[" * _DEEP + b"]" * _DEEP + b"}"),
        ("invalid_json", b'{"a":' * _DEEP + b"1" + b"}" * _DEEP),
        ("invalid_json", valid_json.replace(b'"ids":[', b'"ids":[' + b"9" * 5000 + b",", 1)),
        ("invalid_json", valid_json.replace(b'"model":"emb"', b'"model":"\xff\xfe"', 1)),
        (
            "invalid_field",
            valid_json.replace(b'"values":[[', b'"values":[[1e39,', 1).replace(b",1.0,", b",", 1),
        ),
        ("truncated", bytes(huge_n)),
        ("truncated", b""),
    ]


def _sample(upd: object, name: str, labels: dict[str, str]) -> float:
    return upd.metrics.registry.get_sample_value(name, labels) or 0.0  # type: ignore[attr-defined]


async def test_crash_class_messages_are_dead_lettered_and_the_rows_behind_them_applied(
    kafka: Broker, ps_cluster: PsCluster, unique: str
) -> None:
    s = updater_settings(kafka, ps_cluster, unique)
    topic = s["topics"][0]
    ids = np.arange(41000, 41400, dtype=np.int64)
    shards = shard_for(ids, 2)
    chunks = np.array_split(ids, 8)  # good rows before, between and after the poison messages
    newest = np.stack([ids, ids + 0.5, np.full(len(ids), 2.0), np.full(len(ids), 3.0)], 1).astype(np.float32)
    row = {int(k): newest[i] for i, k in enumerate(ids.tolist())}

    def good(chunk: np.ndarray, shard: int) -> bytes:
        sel = chunk[shard_for(chunk, 2) == shard]
        delta = EmbeddingDelta(
            model="emb",
            table="item",
            op="upsert",
            ids=sel,
            values=np.stack([row[int(k)] for k in sel]),
            timestamp_ms=1,
        )
        return encode_delta(delta)

    probe = EmbeddingDelta(
        model="emb", table="item", op="upsert", ids=[41000], values=[[1.0, 1.0, 1.0, 1.0]], timestamp_ms=1
    )
    poison = _crash_class(encode_delta_json(probe), encode_delta(probe))
    sent: list[tuple[int, str, bytes]] = []  # (partition, reason, value) of each poison message
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        for i, chunk in enumerate(chunks):
            for shard in (0, 1):  # shard s -> partition s (of 4)
                key = message_key("emb", shard)
                await producer.send_and_wait(topic, good(chunk, shard), key=key, partition=shard)
                if i < len(poison):
                    reason, value = poison[i]
                    await producer.send_and_wait(topic, value, key=key, partition=shard)
                    sent.append((shard, reason, value))
    finally:
        await producer.stop()

    async with running(s) as upd:

        async def applied() -> bool:
            views = await _rows(ps_cluster, "item", ids)
            return all(np.array_equal(v, newest) for v in views)

        await eventually(applied, timeout_s=60, what="every row behind the poison messages on every replica")
        for replica, view in enumerate(await _rows(ps_cluster, "item", ids)):
            for k, got, want, shard in zip(
                ids.tolist(), view.tolist(), newest.tolist(), shards.tolist(), strict=True
            ):
                assert got == want, (
                    f"key {k} (shard {shard}, replica {replica}): PS has {got}, published {want}"
                )

        async def all_dead() -> bool:
            total = sum(
                _sample(upd, "embedgate_updater_dead_letters_total", {"reason": r})
                for r in {r for _, r, _ in sent}
            )
            return total == len(sent)

        await eventually(all_dead, what=f"{len(sent)} poison messages dead-lettered")
        # the decoders named every one of them: none needed the loop's last line of defence
        assert _sample(upd, "embedgate_updater_dead_letters_total", {"reason": DECODER_ERROR}) == 0

    got = await _read_all(kafka, s["dead_letter_topic"], f"{unique}-dlq-reader", len(sent))
    assert len(got) == len(sent)
    by_place = {(int(dict(r.headers)["embedgate.partition"]), r.value): r for r in got}
    for partition, reason, value in sent:
        rec = by_place[(partition, value)]
        headers = {k: v.decode() for k, v in rec.headers}
        assert headers["embedgate.reason"] == reason, headers
        assert headers["embedgate.topic"] == topic and headers["embedgate.error"]
