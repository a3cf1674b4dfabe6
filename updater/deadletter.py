"""The dead-letterer: invalid messages go to the dead-letter topic with the reason, before their offsets commit.

:class:`DeadLetterer` copies each message it is given (:meth:`DeadLetterer.add`) to the dead-letter topic, with its
value and key unchanged and these headers: ``embedgate.reason`` (a :class:`schemas.deltas.DeltaError` reason such
as ``bad_magic``, ``unknown_model``, ``wrong_partition``, ``apply_rejected``), ``embedgate.error`` (the message,
at most 4000 bytes), ``embedgate.topic``, ``embedgate.partition`` and ``embedgate.offset`` (where it came from).

A message counts as handled only once the broker acknowledged its copy: until then :meth:`DeadLetterer.held`
reports its offset, which the loop does not commit past, and its partition is paused. When a copy fails,
:func:`updater.errors.kafka_action` decides: ``FATAL`` (e.g. not authorized on the topic) raises the Kafka error out
of :meth:`DeadLetterer.flush` (the updater stops with it; nothing is committed past the message); anything else
keeps the messages that failed and sends them again after the retry backoff (``retry.*``), so an unavailable
dead-letter topic delays the partition, never loses the message. A copy may then be written twice (at-least-once).
Time comes from the injected ``clock``. Not task-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from schemas.deltas import DeltaError
from schemas.updater_settings import RetrySettings
from updater.errors import KafkaAction, kafka_action
from updater.kafka_client import DeadLetterProducer, Record
from updater.metrics import UpdaterMetrics
from updater.scheduler import Clock, backoff_s

__all__ = ["DeadLetterer", "dead_letter_headers"]

log = logging.getLogger("embedgate.updater")

_MAX_ERROR_BYTES = 4000


def dead_letter_headers(rec: Record, exc: DeltaError) -> list[tuple[str, bytes]]:
    """The headers of ``rec``'s copy on the dead-letter topic (see the module doc)."""
    return [
        ("embedgate.reason", exc.reason.encode()),
        ("embedgate.error", str(exc).encode("utf-8", "replace")[:_MAX_ERROR_BYTES]),
        ("embedgate.topic", rec.topic.encode()),
        ("embedgate.partition", str(rec.partition).encode()),
        ("embedgate.offset", str(rec.offset).encode()),
    ]


@dataclass
class _Letter:
    record: Record
    reason: DeltaError


class DeadLetterer:
    """Sends invalid messages to ``topic`` through ``producer`` (an ``AIOKafkaProducer`` with ``acks="all"``)."""

    def __init__(
        self,
        producer: DeadLetterProducer,
        topic: str,
        metrics: UpdaterMetrics,
        retry: RetrySettings,
        *,
        clock: Clock = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._metrics = metrics
        self._retry = retry
        self._clock = clock
        self._rand = rand
        self._letters: list[_Letter] = []
        self._attempts = 0
        self._next_try = 0.0
        self._generation = 0

    def add(self, record: Record, reason: DeltaError) -> None:
        """Queue ``record`` for the dead-letter topic; sent by the next :meth:`flush`."""
        self._metrics.messages.labels("invalid").inc()
        log.warning(
            "dead-letter %s[%d]@%d: %s: %s",
            record.topic,
            record.partition,
            record.offset,
            reason.reason,
            reason,
        )
        self._letters.append(_Letter(record, reason))

    def held(self) -> list[tuple[TopicPartition, int]]:
        """``(partition, offset)`` of every queued message not acknowledged by the broker yet."""
        return [(TopicPartition(x.record.topic, x.record.partition), x.record.offset) for x in self._letters]

    def next_due(self) -> float | None:
        """Clock time of the next send (None: nothing queued)."""
        return self._next_try if self._letters else None

    def reset(self) -> None:
        """Forget every queued message (partitions revoked: their new owner reads and judges them again)."""
        self._letters = []
        self._attempts = 0
        self._next_try = 0.0
        self._generation += 1

    async def flush(self) -> None:
        """Send every queued message if the backoff allows; returns once the broker acknowledged them, or after a
        failure (the failed ones stay queued, see the module doc). Raises the Kafka error when it is ``FATAL``."""
        if not self._letters or self._clock() < self._next_try:
            return
        letters, generation = self._letters, self._generation
        results = await asyncio.gather(*(self._send(x) for x in letters), return_exceptions=True)
        failed: list[_Letter] = []
        first: BaseException | None = None
        for letter, result in zip(letters, results, strict=True):
            if result is None:
                self._metrics.dead_letters.labels(letter.reason.reason).inc()
                continue
            if not isinstance(result, KafkaError):
                raise result
            if kafka_action(result) is KafkaAction.FATAL:
                raise result
            failed.append(letter)
            first = first or result
        if generation != self._generation:
            return  # reset meanwhile: the new owner redelivers whatever was not acknowledged
        self._letters = [*failed, *self._letters[len(letters) :]]
        if not failed:
            self._attempts = 0
            self._next_try = 0.0
            return
        self._attempts += 1
        delay = backoff_s(self._attempts, self._retry, self._rand)
        self._next_try = self._clock() + delay
        log.warning(
            "dead-letter topic %s: %d messages not written (attempt %d, next in %.2f s): %r",
            self._topic,
            len(failed),
            self._attempts,
            delay,
            first,
        )

    async def _send(self, letter: _Letter) -> None:
        rec = letter.record
        future = await self._producer.send(
            self._topic, value=rec.value, key=rec.key, headers=dead_letter_headers(rec, letter.reason)
        )
        await future
