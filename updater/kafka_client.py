"""What the updater's loop uses of Kafka, as protocols: the consumer group member and the dead-letter producer.

:class:`KafkaClient` is the subset of ``aiokafka.AIOKafkaConsumer`` that :class:`updater.loop.ConsumerLoop` calls
(``AIOKafkaConsumer`` satisfies it structurally); :class:`DeadLetterProducer` the subset of
``aiokafka.AIOKafkaProducer`` that :class:`updater.deadletter.DeadLetterer` calls; :class:`Record` the fields of a
``ConsumerRecord`` the loop reads. Unit tests pass fakes of these (no broker). Errors are aiokafka's
``KafkaError`` subclasses; what each means to the loop is :func:`updater.errors.kafka_action`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any, Protocol

from aiokafka import TopicPartition

__all__ = ["DeadLetterProducer", "KafkaClient", "Record"]


class Record(Protocol):
    """One consumed message (``aiokafka.ConsumerRecord``): where it is, what it carries, its timestamp in ms."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int: ...


class KafkaClient(Protocol):
    """A consumer group member with manual commits (``enable_auto_commit=False``), already subscribed."""

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]: ...

    async def commit(self, offsets: Any = None) -> None: ...

    async def committed(self, partition: TopicPartition) -> int | None: ...

    async def position(self, partition: TopicPartition) -> int: ...

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, Any]: ...

    def assignment(self) -> set[TopicPartition]: ...

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    def highwater(self, partition: TopicPartition) -> int | None: ...

    def partitions_for_topic(self, topic: str) -> Collection[int] | None: ...


class DeadLetterProducer(Protocol):
    """Sends a message; the returned future resolves once the broker acknowledged it (raises ``KafkaError``)."""

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]: ...
