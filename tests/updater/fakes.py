"""Fakes of the updater loop's seams for unit tests without a broker or PS: a Kafka client, a dead-letter producer,
a shard writer, catch-ups and a clock the test advances by hand."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import TopicPartition

from schemas.deltas import DeltaOp, EmbeddingDelta, encode_delta
from schemas.manifest import Manifest
from schemas.partition import shard_for
from updater.apply import GroupKey, WriteGroup
from updater.replicas import PositionBook, Replica

__all__ = [
    "MANIFEST",
    "TOPIC",
    "FakeCatchUps",
    "FakeClient",
    "FakeClock",
    "FakeProducer",
    "FakeRecord",
    "FakeWriter",
    "delta_record",
    "ids_of_shard",
]

TOPIC = "unit.deltas"
MANIFEST = Manifest.model_validate(
    {
        "model_name": "unit",
        "version": 1,
        "tables": [{"name": "item", "dim": 2}],
        "sparse_features": [{"name": "item_id", "table": "item"}],
        "partition": {"num_shards": 2},
        "entry": {"outputs": [{"name": "p", "shape": [1]}]},
    }
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class FakeRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 0


def ids_of_shard(shard: int, count: int, start: int = 0) -> list[int]:
    """``count`` ids from ``start`` on that hash to ``shard`` of MANIFEST's 2."""
    out: list[int] = []
    for i in itertools.count(start):
        if int(shard_for([i], MANIFEST.num_shards)[0]) == shard:
            out.append(i)
            if len(out) == count:
                return out
    raise AssertionError("unreachable")


def delta_record(
    partition: int,
    offset: int,
    ids: list[int],
    value: float = 1.0,
    *,
    ts: int = 1,
    value_bytes: bytes | None = None,
) -> FakeRecord:
    """A record at ``partition``/``offset`` upserting ``ids`` of table ``item`` with rows filled with ``value``."""
    if value_bytes is not None:
        return FakeRecord(TOPIC, partition, offset, b"unit/0", value_bytes)
    delta = EmbeddingDelta(
        model="unit",
        table="item",
        op=DeltaOp.UPSERT,
        ids=np.array(ids, np.int64),
        values=np.full((len(ids), 2), value, np.float32),
        timestamp_ms=ts,
    )
    return FakeRecord(TOPIC, partition, offset, b"unit/0", encode_delta(delta))


class FakeClient:
    """A group member assigned ``partitions`` of TOPIC (of ``count`` partitions); ``feed`` queues getmany answers."""

    def __init__(self, partitions: Collection[int] = (0, 1), count: int = 2) -> None:
        self.assigned = {TopicPartition(TOPIC, p) for p in partitions}
        self.count = count
        self.batches: list[list[FakeRecord]] = []
        self.commits: list[dict[TopicPartition, int]] = []
        self.committed_offsets: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.fetches = 0
        self.commit_error: BaseException | None = None

    def feed(self, *records: FakeRecord) -> None:
        self.batches.append(list(records))

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]:
        await asyncio.sleep(0)
        self.fetches += 1
        out: dict[TopicPartition, list[Any]] = {}
        if self.batches:
            for rec in self.batches.pop(0):
                out.setdefault(TopicPartition(rec.topic, rec.partition), []).append(rec)
        return out

    async def commit(self, offsets: Any = None) -> None:
        await asyncio.sleep(0)
        if self.commit_error is not None:
            err, self.commit_error = self.commit_error, None
            raise err
        self.commits.append(dict(offsets))
        self.committed_offsets.update(offsets)

    async def committed(self, partition: TopicPartition) -> int | None:
        return self.committed_offsets.get(partition)

    async def position(self, partition: TopicPartition) -> int:
        return self.committed_offsets.get(partition, 0)

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(partitions, 0)

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        return dict.fromkeys(timestamps)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.seeks.append((partition, offset))

    def highwater(self, partition: TopicPartition) -> int | None:
        return None

    def partitions_for_topic(self, topic: str) -> Collection[int] | None:
        return set(range(self.count))

    def last_commit(self, partition: int) -> int | None:
        return self.committed_offsets.get(TopicPartition(TOPIC, partition))


class FakeProducer:
    """Dead-letter producer; ``fail`` (an exception) makes every send's future fail until cleared."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, dict[str, bytes]]] = []
        self.fail: BaseException | None = None

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail is not None:
            fut.set_exception(self.fail)
        else:
            self.sent.append((topic, value, dict(headers or [])))
            fut.set_result(None)
        return fut


@dataclass
class FakeWriter:
    """Writes nothing; records each group. A shard's ``gates`` entry holds its writes until set; ``failures`` raise,
    in order, for that shard's next writes."""

    calls: list[WriteGroup] = field(default_factory=list)
    gates: dict[int, asyncio.Event] = field(default_factory=dict)
    failures: dict[int, list[Exception]] = field(default_factory=dict)
    acked: list[WriteGroup] = field(default_factory=list)
    active: dict[GroupKey, int] = field(default_factory=dict)
    max_active: int = 0

    def hold(self, shard: int) -> asyncio.Event:
        self.gates[shard] = asyncio.Event()
        return self.gates[shard]

    async def apply(
        self, group: WriteGroup, expected: Callable[[str], dict[str, int]] | None = None
    ) -> dict[str, dict[str, int]]:
        self.calls.append(group)
        self.active[group.key] = self.active.get(group.key, 0) + 1
        self.max_active = max(self.max_active, self.active[group.key])
        try:
            gate = self.gates.get(group.key.shard)
            if gate is not None:
                await gate.wait()
            pending = self.failures.get(group.key.shard)
            if pending:
                raise pending.pop(0)
        finally:
            self.active[group.key] -= 1
        self.acked.append(group)
        return {}

    async def stream_position(self, replica: Replica) -> dict[str, dict[str, int]]:
        return {}


class FakeCatchUps:
    def __init__(self) -> None:
        self.started: list[tuple[Replica, str, int, int]] = []

    def start(
        self,
        book: PositionBook,
        replica: Replica,
        key: str,
        had: int,
        end: int,
        live_end: Callable[[], int] | None = None,
    ) -> None:
        self.started.append((replica, key, had, end))

    def cancel(self) -> None:
        return None

    async def close(self) -> None:
        return None
