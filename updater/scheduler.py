"""When shard writes happen: which groups are due, which partitions pause, when a failed write is tried again.

:func:`backoff_s` is the retry policy (pure): after the ``attempts``-th failure in a row a group waits
``min_backoff_ms * 2**(attempts-1)`` capped at ``max_backoff_ms``, times a jitter factor in ``[0.75, 1.25)`` so that
several updaters do not retry in lockstep.

:class:`ApplyScheduler` holds every group of rows the loop has read but no replica set has acknowledged yet, each in
one of three states, keyed by :class:`updater.apply.GroupKey` (one model, shard and table):

- **pending**: waiting to be written (new rows, or a failed group waiting for its backoff deadline);
- **in flight**: handed to the loop to write (:meth:`ApplyScheduler.take_due`); at most **one write per key** is in
  flight, so the writes of a table on a shard, and the stream positions they record, reach every replica in log
  order. Rows read meanwhile collect in the key's pending group and go in the next write (adaptive batching);
- **failed** (retriable): back to pending, in front of any newer rows of its key, due after the backoff.

Its records' offsets are what the loop must not commit past (:meth:`ApplyScheduler.waiting_offsets`); partitions
holding rows of a failing group are paused (:meth:`ApplyScheduler.held_partitions`). Time comes from the injected
``clock`` (monotonic seconds), so unit tests advance it by hand. :meth:`ApplyScheduler.reset` (a rebalance) drops
everything pending and marks the writes in flight stale: their outcome is ignored, but their keys stay busy until
they finish, so a write of the new generation never overtakes one of the old. No I/O; not task-safe: one event loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aiokafka import TopicPartition

from schemas.updater_settings import RetrySettings
from updater.apply import GroupKey
from updater.batch import GroupBuffer

__all__ = ["ApplyScheduler", "Clock", "backoff_s"]

Clock = Callable[[], float]
"""Monotonic seconds (``time.monotonic`` in production)."""


def backoff_s(attempts: int, retry: RetrySettings, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait after the ``attempts``-th failure in a row (``attempts >= 1``); ``rand`` returns [0, 1)."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    base_ms: int = min(retry.max_backoff_ms, retry.min_backoff_ms * 2 ** min(attempts - 1, 30))
    return base_ms / 1000 * (0.75 + 0.5 * rand())


@dataclass
class _Flight:
    buf: GroupBuffer
    generation: int
    firsts: dict[TopicPartition, int]


def _firsts(buf: GroupBuffer) -> dict[TopicPartition, int]:
    """The lowest offset of ``buf``'s records in each partition."""
    out: dict[TopicPartition, int] = {}
    for rec in buf.records:
        tp = TopicPartition(rec.topic, rec.partition)
        if rec.offset < out.get(tp, rec.offset + 1):
            out[tp] = rec.offset
    return out


def _merge(into: dict[TopicPartition, int], other: dict[TopicPartition, int]) -> None:
    for tp, offset in other.items():
        if offset < into.get(tp, offset + 1):
            into[tp] = offset


class ApplyScheduler:
    """The pending and in-flight groups of one consumer loop (see the module doc).

    ``max_pending_rows`` bounds the rows waiting behind writes in flight: :meth:`full` tells the loop to stop
    fetching until a write finishes (groups waiting for a backoff do not count: their partitions are paused)."""

    def __init__(
        self,
        retry: RetrySettings,
        *,
        max_pending_rows: int,
        clock: Clock = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if max_pending_rows < 1:
            raise ValueError(f"max_pending_rows must be >= 1, got {max_pending_rows}")
        self._retry = retry
        self._max_pending_rows = max_pending_rows
        self._clock = clock
        self._rand = rand
        self._pending: dict[GroupKey, GroupBuffer] = {}
        self._pending_firsts: dict[GroupKey, dict[TopicPartition, int]] = {}  # lowest offset per partition
        self._fresh_rows = 0  # rows of pending groups that never failed (what full() bounds)
        self._flying: dict[GroupKey, _Flight] = {}
        self._generation = 0

    # -- rows in ------------------------------------------------------------------------------------------------
    def add(self, buf: GroupBuffer) -> None:
        """New rows of ``buf.key``, read after every row already held for that key."""
        waiting = self._pending.get(buf.key)
        firsts = _firsts(buf)
        if waiting is None:
            self._pending[buf.key] = buf
            self._pending_firsts[buf.key] = firsts
        else:
            waiting.absorb(buf)
            _merge(self._pending_firsts[buf.key], firsts)
        if waiting is None or waiting.attempts == 0:
            self._fresh_rows += buf.rows

    def take_due(self) -> list[GroupBuffer]:
        """The pending groups to write now (their key has no write in flight and no backoff running), marked in
        flight. The caller writes each and reports it with :meth:`succeeded`, :meth:`failed` or :meth:`rejected`."""
        now = self._clock()
        due = [buf for key, buf in self._pending.items() if key not in self._flying and buf.next_try <= now]
        for buf in due:
            del self._pending[buf.key]
            self._flying[buf.key] = _Flight(buf, self._generation, self._pending_firsts.pop(buf.key))
            if buf.attempts == 0:
                self._fresh_rows -= buf.rows
        return due

    # -- outcomes -----------------------------------------------------------------------------------------------
    def _land(self, buf: GroupBuffer) -> _Flight | None:
        """Take ``buf`` out of flight; the flight, or None when it was stale."""
        flight = self._flying.get(buf.key)
        if flight is None or flight.buf is not buf:
            raise RuntimeError(f"group {buf.key} is not in flight")
        del self._flying[buf.key]
        return flight if flight.generation == self._generation else None

    def succeeded(self, buf: GroupBuffer) -> bool:
        """Every replica acknowledged ``buf``. False when it was written before a :meth:`reset` (ignore it)."""
        return self._land(buf) is not None

    def failed(self, buf: GroupBuffer) -> float | None:
        """A retriable failure: ``buf`` waits, in front of newer rows of its key, for the backoff; returns the delay
        in seconds, or None when the write was stale (started before a :meth:`reset`: dropped)."""
        flight = self._land(buf)
        if flight is None:
            return None
        buf.attempts += 1
        delay = backoff_s(buf.attempts, self._retry, self._rand)
        buf.next_try = self._clock() + delay
        newer = self._pending.pop(buf.key, None)
        if newer is not None:
            buf.absorb(newer)
            _merge(flight.firsts, self._pending_firsts.pop(buf.key))
            self._fresh_rows -= newer.rows  # newer never failed itself (it waited behind buf)
        self._pending[buf.key] = buf
        self._pending_firsts[buf.key] = flight.firsts
        return delay

    def rejected(self, buf: GroupBuffer) -> bool:
        """The replicas refused ``buf`` (the caller dead-letters its records). False when stale."""
        return self._land(buf) is not None

    def reset(self) -> None:
        """Drop every pending group; writes in flight become stale (see the module doc)."""
        self._pending.clear()
        self._pending_firsts.clear()
        self._fresh_rows = 0
        self._generation += 1

    # -- what the loop asks -------------------------------------------------------------------------------------
    def _live(self) -> Iterator[tuple[GroupBuffer, dict[TopicPartition, int]]]:
        for key, buf in self._pending.items():
            yield buf, self._pending_firsts[key]
        yield from ((f.buf, f.firsts) for f in self._flying.values() if f.generation == self._generation)

    def waiting_offsets(self) -> Iterator[tuple[TopicPartition, int]]:
        """Per group and partition, the lowest offset of a record whose rows are not acknowledged yet (pending or
        in flight): no offset at or after it may be committed."""
        for _, firsts in self._live():
            yield from firsts.items()

    def held_partitions(self) -> set[TopicPartition]:
        """Partitions with records in a group that failed and is waiting or being retried: pause them."""
        return {tp for buf, firsts in self._live() if buf.attempts > 0 for tp in firsts}

    def next_due(self) -> float | None:
        """Clock time when the earliest pending group with no write in flight becomes due (None: none waits)."""
        times = [b.next_try for k, b in self._pending.items() if k not in self._flying]
        return min(times) if times else None

    def full(self) -> bool:
        """Enough rows wait behind writes in flight: fetch nothing more until one finishes."""
        return self._fresh_rows >= self._max_pending_rows

    def in_flight(self) -> int:
        """Writes in flight, stale ones included."""
        return len(self._flying)

    def waiting_groups(self) -> int:
        """Groups held that no replica set acknowledged yet (pending, or in flight and not stale)."""
        return sum(1 for _ in self._live())
