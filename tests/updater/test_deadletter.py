"""updater.deadletter.DeadLetterer with a fake producer and clock: what a copy carries, and what a failed copy holds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

from schemas.deltas import DeltaError
from schemas.updater_settings import RetrySettings
from tests.updater.fakes import FakeClock, FakeProducer, FakeRecord
from updater.deadletter import DeadLetterer
from updater.metrics import UpdaterMetrics

RETRY = RetrySettings(min_backoff_ms=1000, max_backoff_ms=4000)


class _FlakyProducer(FakeProducer):
    """Fails the send of records whose value is in ``failing``."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[bytes] = set()

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        if value in self.failing:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_exception(KafkaTimeoutError())
            return fut
        return await super().send(topic, value, key, partition, timestamp_ms, headers)


def _rec(offset: int) -> FakeRecord:
    return FakeRecord("src", 3, offset, b"k", f"v{offset}".encode())


def _sent(metrics: UpdaterMetrics) -> float:
    return sum(
        s.value for m in metrics.dead_letters.collect() for s in m.samples if s.name.endswith("_total")
    )


async def test_a_copy_carries_the_value_key_and_where_it_came_from() -> None:
    producer, metrics = FakeProducer(), UpdaterMetrics()
    dl = DeadLetterer(producer, "dlq", metrics, RETRY, clock=FakeClock())
    dl.add(_rec(7), DeltaError("bad_magic", "x" * 5000))
    assert dl.held() == [(TopicPartition("src", 3), 7)]
    await dl.flush()
    [(topic, value, headers)] = producer.sent
    assert (topic, value) == ("dlq", b"v7")
    assert headers["embedgate.reason"] == b"bad_magic" and len(headers["embedgate.error"]) == 4000
    assert (headers["embedgate.topic"], headers["embedgate.partition"], headers["embedgate.offset"]) == (
        b"src",
        b"3",
        b"7",
    )
    assert dl.held() == [] and _sent(metrics) == 1


async def test_only_the_failed_copies_stay_held_and_are_retried_after_the_backoff() -> None:
    producer, metrics, clock = _FlakyProducer(), UpdaterMetrics(), FakeClock()
    dl = DeadLetterer(producer, "dlq", metrics, RETRY, clock=clock, rand=lambda: 0.5)
    producer.failing = {b"v1"}
    for off in (0, 1, 2):
        dl.add(_rec(off), DeltaError("bad_magic", "bad"))
    await dl.flush()
    assert dl.held() == [(TopicPartition("src", 3), 1)]
    assert _sent(metrics) == 2 and dl.next_due() == clock.now + 1.0
    producer.failing = set()
    await dl.flush()
    assert dl.held() != [], "sent again before the backoff"
    clock.advance(1.01)
    await dl.flush()
    assert dl.held() == [] and _sent(metrics) == 3 and dl.next_due() is None


async def test_a_fatal_error_raises_and_keeps_the_message_held() -> None:
    producer = FakeProducer()
    producer.fail = TopicAuthorizationFailedError()
    dl = DeadLetterer(producer, "dlq", UpdaterMetrics(), RETRY, clock=FakeClock())
    dl.add(_rec(0), DeltaError("bad_magic", "bad"))
    with pytest.raises(TopicAuthorizationFailedError):
        await dl.flush()
    assert dl.held() == [(TopicPartition("src", 3), 0)]


async def test_reset_forgets_what_was_not_acknowledged() -> None:
    dl = DeadLetterer(FakeProducer(), "dlq", UpdaterMetrics(), RETRY, clock=FakeClock())
    dl.add(_rec(0), DeltaError("bad_magic", "bad"))
    dl.reset()
    assert dl.held() == [] and dl.next_due() is None
