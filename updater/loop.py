"""The updater's consumer loop: fetch, decode, write, commit, over an injected Kafka client. At-least-once.

:class:`ConsumerLoop` composes the parts, each its own module: a :class:`updater.kafka_client.KafkaClient` (the
group member; ``AIOKafkaConsumer`` in production, a fake in unit tests), a :class:`updater.ingest.RecordDecoder`,
an :class:`updater.scheduler.ApplyScheduler` (which groups are due, pauses, backoff deadlines), a writer
(:class:`updater.apply.ShardWriter`), a :class:`updater.deadletter.DeadLetterer`, an
:class:`updater.ledger.OffsetLedger` (what may be committed) and the replicas' :class:`updater.replicas.PositionBook`
with :class:`updater.catchup.CatchUpTasks` (self-healing replay). Time comes from the injected ``clock``.

One :meth:`ConsumerLoop.step`:

1. start a **fetch** (a task) unless one runs or the scheduler is full: up to ``batch.max_messages`` records, waiting
   at most ``batch.max_delay_ms`` for more once one arrived;
2. start a **write** task for every due group (one per (model, shard, table) at a time: rows of a key reach every
   replica in log order), then wait until the fetch or any write finishes (or a backoff deadline, at most 0.2 s):
   the next fetch and decode run while writes are in flight;
3. for each finished write: acknowledged by every replica -> done; retriable failure -> the scheduler keeps the
   group, in front of newer rows of its key, for the backoff and its partitions pause; rejected -> its messages are
   dead-lettered (reason ``apply_rejected``);
4. for a finished fetch: **decode + group** the records (invalid ones go to the dead-letterer; HPS beacons are
   skipped), mark them fetched in the ledger and hand the groups to the scheduler; a Kafka error of the fetch or
   of a commit is acted on as :func:`updater.errors.kafka_action` decides (raise, rejoin, or retry);
5. send queued dead letters, **commit** per partition the lowest offset whose rows are not acknowledged yet (pending,
   in flight, or a dead letter not acknowledged by the broker; else the next offset), pause/resume partitions, update
   lag, compare replicas' positions (every 5 s), log progress.

So an offset is committed only once every replica of every shard touched by the records before it acknowledged their
rows, or the record was dead-lettered. A rebalance (:meth:`on_revoked`) drops everything uncommitted (the new owner
replays it); writes still in flight finish, and their outcome is ignored. Not task-safe: one event loop; the
rebalance callbacks run in the same loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter

from schemas.deltas import DeltaError
from schemas.manifest import stream_partition_key
from schemas.updater_settings import BatchSettings
from updater.apply import WriteGroup
from updater.batch import GroupBuffer
from updater.deadletter import DeadLetterer
from updater.errors import ApplyError, KafkaAction, kafka_action
from updater.ingest import RecordDecoder
from updater.kafka_client import KafkaClient
from updater.ledger import OffsetLedger
from updater.metrics import UpdaterMetrics
from updater.replicas import PositionBook, Replica
from updater.scheduler import ApplyScheduler, Clock

__all__ = ["CatchUps", "ConsumerLoop", "Writer", "iso_ms"]

log = logging.getLogger("embedgate.updater")

_IDLE_WAIT_S = 0.2  # longest wait of one step; also the fetch's wait when nothing is buffered
_PROGRESS_EVERY_S = 30.0
_REPLICA_CHECK_S = 5.0  # how often replicas' stream positions are compared with what they acknowledged
_END_OFFSETS_EVERY_S = 2.0
_FETCH_PASSES = 1000


class Writer(Protocol):
    """What the loop uses of :class:`updater.apply.ShardWriter`."""

    async def apply(
        self, group: WriteGroup, expected: Callable[[str], dict[str, int]] | None = None
    ) -> dict[str, dict[str, int]]: ...

    async def stream_position(self, replica: Replica) -> dict[str, dict[str, int]]: ...


class CatchUps(Protocol):
    """What the loop uses of :class:`updater.catchup.CatchUpTasks`."""

    def start(
        self,
        book: PositionBook,
        replica: Replica,
        key: str,
        had: int,
        end: int,
        live_end: Callable[[], int] | None = None,
    ) -> None: ...

    def cancel(self) -> None: ...

    async def close(self) -> None: ...


class ConsumerLoop:
    """One consumer loop (see the module doc). Drive it with :meth:`run`, or :meth:`step` in tests; :meth:`stop`
    asks it to finish. ``replay_ms``: on the first non-empty assignment, seek to the first record at/after that time
    (ms since the epoch) but never past the committed offset."""

    def __init__(
        self,
        *,
        client: KafkaClient,
        decoder: RecordDecoder,
        scheduler: ApplyScheduler,
        writer: Writer,
        dead_letters: DeadLetterer,
        catch_ups: CatchUps,
        metrics: UpdaterMetrics,
        batch: BatchSettings,
        stop: asyncio.Event,
        clock: Clock,
        replay_ms: int | None = None,
    ) -> None:
        self._client = client
        self._decoder = decoder
        self._scheduler = scheduler
        self._writer = writer
        self._dead_letters = dead_letters
        self._catch_ups = catch_ups
        self.metrics = metrics
        self._batch = batch
        self._stop = stop
        self._clock = clock
        self._replay_ms = replay_ms
        self._ledger = OffsetLedger()
        self._book = PositionBook()
        self._generation = 0
        self._fetching: asyncio.Task[tuple[list[Any], KafkaError | None]] | None = None
        self._fetch_generation = 0
        self._writes: dict[asyncio.Task[ApplyError | None], GroupBuffer] = {}
        self._paused: set[TopicPartition] = set()
        self.fatal: KafkaError | None = None
        now = clock()
        self._last_progress = now
        self._last_applied = 0.0
        self._last_end_offsets = float("-inf")
        self._last_replica_check = now

    # -- driving ------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Step until :meth:`stop`, then :meth:`drain`; raises a fatal Kafka error (after draining)."""
        try:
            while not self._stop.is_set():
                await self.step()
            await self.drain()
        finally:
            await self._abandon()
        if self.fatal is not None:
            raise self.fatal

    async def step(self) -> None:
        """One iteration (see the module doc)."""
        if self._fetching is None and not self._stop.is_set() and not self._scheduler.full():
            self._fetch_generation = self._generation
            self._fetching = asyncio.create_task(self._fetch(), name="updater fetch")
        self._dispatch()
        waitables: set[asyncio.Task[Any]] = set(self._writes)
        if self._fetching is not None:
            waitables.add(self._fetching)
        timeout = self._wait_s()
        if waitables:
            await asyncio.wait(waitables, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        else:  # full and nothing in flight cannot happen; stopping: nothing to wait for
            await asyncio.sleep(0)
        self._land_writes()
        if self._fetching is not None and self._fetching.done():
            task, self._fetching = self._fetching, None
            records, error = task.result()
            if self._fetch_generation != self._generation:
                self._rewind(records)  # a rebalance happened while fetching: read them again
            else:
                self._ingest(records)
            if error is not None:
                self._kafka_error("fetch", error)
        self._dispatch()
        await self._dead_letters.flush()
        await self._commit()
        self._update_pauses()
        await self._update_lag()
        await self._check_replicas()
        self._log_progress()

    async def drain(self) -> None:
        """Wait for the writes in flight (each bounded by the writer's deadline), send dead letters, commit."""
        if self._writes:
            await asyncio.wait(set(self._writes))
        self._land_writes()
        await self._dead_letters.flush()
        await self._commit()

    async def _abandon(self) -> None:
        """Cancel what still runs: the fetch (its records were not marked fetched) and writes (after an error)."""
        tasks: list[asyncio.Task[Any]] = [*self._writes]
        if self._fetching is not None:
            tasks.append(self._fetching)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._writes.clear()
        self._fetching = None
        await self._catch_ups.close()

    def _wait_s(self) -> float:
        deadlines = [d for d in (self._scheduler.next_due(), self._dead_letters.next_due()) if d is not None]
        if not deadlines:
            return _IDLE_WAIT_S
        return min(_IDLE_WAIT_S, max(0.0, min(deadlines) - self._clock()))

    # -- fetch and ingest ---------------------------------------------------------------------------------------
    async def _fetch(self) -> tuple[list[Any], KafkaError | None]:
        """Records in partition order; once one arrived, more are gathered for up to ``batch.max_delay_ms``. A Kafka
        error ends the fetch: the records read before it are returned with it (the client's position is past them)."""
        out: list[Any] = []
        deadline: float | None = None
        for _ in range(_FETCH_PASSES):  # bounded: each pass waits or gathers records
            timeout = _IDLE_WAIT_S if deadline is None else max(0.0, deadline - self._clock())
            try:
                got = await self._client.getmany(
                    timeout_ms=int(timeout * 1000), max_records=max(1, self._batch.max_messages - len(out))
                )
            except KafkaError as exc:
                return out, exc
            fresh = [rec for recs in got.values() for rec in recs]
            out.extend(fresh)
            if not out or not fresh or len(out) >= self._batch.max_messages or self._stop.is_set():
                break
            if deadline is None:
                deadline = self._clock() + self._batch.max_delay_ms / 1000
            elif self._clock() >= deadline:
                break
        return out, None

    def _ingest(self, records: list[Any]) -> None:
        groups, invalid = self._decoder.group(records)
        for rec, exc in invalid:
            self._dead_letters.add(rec, exc)
        for buf in groups:
            self._scheduler.add(buf)
        ends: dict[TopicPartition, int] = {}
        for rec in records:
            tp = TopicPartition(rec.topic, rec.partition)
            ends[tp] = max(ends.get(tp, 0), rec.offset + 1)
        for tp, end in ends.items():
            self._ledger.fetched(tp, end)

    def _rewind(self, records: list[Any]) -> None:
        """Seek every still-assigned partition back to the first of ``records`` (they were not processed)."""
        first: dict[TopicPartition, int] = {}
        for rec in records:
            tp = TopicPartition(rec.topic, rec.partition)
            first[tp] = min(first.get(tp, rec.offset), rec.offset)
        assigned = self._client.assignment()
        for tp, offset in first.items():
            self._ledger.forget(tp)
            if tp in assigned:
                self._client.seek(tp, offset)

    # -- writes -------------------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        if self._stop.is_set():
            return  # stopping: what is pending is not committed and will be read again
        for buf in self._scheduler.take_due():
            task = asyncio.create_task(
                self._apply_one(buf, self._book, self._generation), name=f"write {buf.key}"
            )
            self._writes[task] = buf

    def _land_writes(self) -> None:
        rejected: list[tuple[Any, DeltaError]] = []
        for task in [t for t in self._writes if t.done()]:
            buf = self._writes.pop(task)
            err = task.result()  # anything but an ApplyError is a bug: it stops the updater
            if err is None:
                self._scheduler.succeeded(buf)
            elif err.retriable:
                delay = self._scheduler.failed(buf)
                if delay is not None and (buf.attempts == 1 or buf.attempts % 10 == 0):
                    log.warning(
                        "shard write failed (attempt %d, %d rows waiting, next in %.2f s): %s",
                        buf.attempts,
                        buf.rows,
                        delay,
                        err,
                    )
            elif self._scheduler.rejected(buf):
                log.error("shard write rejected, dead-lettering %d messages: %s", len(buf.records), err)
                reason = DeltaError("apply_rejected", str(err))
                rejected.extend((rec, reason) for rec in _unique_records(buf.records))
        for rec, reason in rejected:
            self._dead_letters.add(rec, reason)

    async def _apply_one(self, buf: GroupBuffer, book: PositionBook, generation: int) -> ApplyError | None:
        group = buf.build()
        group.positions = buf.positions()
        model, shard, table = buf.key.model, buf.key.shard, buf.key.table

        # target -> the stream_expected its write carried (its last attempt's)
        sent: dict[str, dict[str, int]] = {}

        def expected(target: str) -> dict[str, int]:
            replica = Replica(target, model, shard)
            sent[target] = {k: book.expected(replica, table, k) for k in group.positions}
            return sent[target]

        t0 = self._clock()
        try:
            answers = await self._writer.apply(group, expected)
        except ApplyError as exc:
            self.metrics.apply_failures.labels(model, str(shard), str(exc.retriable).lower()).inc()
            return exc
        self.metrics.apply_latency.labels(model).observe(self._clock() - t0)
        if generation == self._generation:  # else the partitions were revoked: the new owner judges replicas
            for target, previous in answers.items():
                replica = Replica(target, model, shard)
                behind = book.acknowledged(replica, table, group.positions, previous, sent.get(target))
                for key, had in behind.items():
                    self._start_catch_up(replica, key, had)
        if len(group.upsert_ids):
            self.metrics.rows_applied.labels(model, table, "upsert").inc(len(group.upsert_ids))
        if len(group.delete_ids):
            self.metrics.rows_applied.labels(model, table, "delete").inc(len(group.delete_ids))
        now_ms = datetime.now(UTC).timestamp() * 1000
        for ts in buf.timestamps_ms:
            if ts > 0:
                self.metrics.freshness.labels(model).observe(max(0.0, (now_ms - ts) / 1000))
        return None

    # -- replicas that fell behind ------------------------------------------------------------------------------
    def _start_catch_up(self, replica: Replica, key: str, had: int) -> None:
        topic, _, part = key.rpartition(":")
        tp = TopicPartition(topic, int(part))
        self._catch_ups.start(
            self._book, replica, key, had, self._live_end(tp), functools.partial(self._live_end, tp)
        )

    def _live_end(self, tp: TopicPartition) -> int:
        """The offset the live loop has read ``tp`` up to: every row written to a replica so far is below it."""
        fetched = self._ledger.fetched_offset(tp)
        return fetched if fetched is not None else self._ledger.committed_offset(tp) or 0

    async def _check_replicas(self) -> None:
        """Every ``_REPLICA_CHECK_S``: ask each replica written so far for its ``stream_position``; one below what it
        acknowledged (it restarted or loaded another version while nothing was written to it) is caught up. A
        replica that does not answer is left to the write path (its writes are retried)."""
        now = self._clock()
        if now - self._last_replica_check < _REPLICA_CHECK_S:
            return
        self._last_replica_check = now
        book, generation = self._book, self._generation
        snapshot = book.beliefs()
        if not snapshot:
            return
        replicas = list(snapshot)
        answers = await asyncio.gather(
            *(self._writer.stream_position(r) for r in replicas), return_exceptions=True
        )
        if generation != self._generation:
            return
        for replica, reported in zip(replicas, answers, strict=True):
            if isinstance(reported, BaseException):
                if not isinstance(reported, ApplyError):
                    raise reported
                log.debug("stream_position of %s: %s", replica, reported)
                continue
            for key, had in book.check(replica, snapshot[replica], reported).items():
                self._start_catch_up(replica, key, had)

    # -- offsets, pauses, lag -----------------------------------------------------------------------------------
    def _held(self) -> list[tuple[TopicPartition, int]]:
        return [*self._scheduler.waiting_offsets(), *self._dead_letters.held()]

    async def _commit(self) -> None:
        offsets = self._ledger.to_commit(self._held(), set(self._client.assignment()))
        if not offsets:
            return
        generation = self._generation
        try:
            await self._client.commit(offsets)
        except KafkaError as exc:
            if generation == self._generation:
                self._kafka_error("commit", exc)
            elif kafka_action(exc) is KafkaAction.FATAL:
                raise
            return
        if generation == self._generation:
            self._ledger.committed(offsets)
        self.metrics.commits.inc()

    def _kafka_error(self, what: str, exc: KafkaError) -> None:
        """Act on a Kafka error of a fetch or commit as :func:`updater.errors.kafka_action` decides: raise it
        (FATAL), drop everything uncommitted and read it again from the committed offsets (REJOIN), or go on
        (RETRY: nothing was skipped, the next iteration tries again)."""
        action = kafka_action(exc)
        if action is KafkaAction.FATAL:
            raise exc
        if action is KafkaAction.REJOIN:
            log.warning("%s failed (%r); everything uncommitted is read again", what, exc)
            self._rejoin()
        else:
            log.warning("%s failed (%r); will retry on the next iteration", what, exc)

    def _rejoin(self) -> None:
        """This member may have lost its partitions: drop what is uncommitted and seek the partitions it still holds
        back to their committed offsets (a rebalance that follows seeks them again in :meth:`on_assigned`)."""
        back = {tp: self._ledger.committed_offset(tp) for tp in self._client.assignment()}
        self.reset()
        for tp, offset in back.items():
            if offset is not None:
                self._client.seek(tp, offset)
                self._ledger.committed({tp: offset})

    def _update_pauses(self) -> None:
        assigned = self._client.assignment()
        want = self._scheduler.held_partitions()
        want.update(tp for tp, _ in self._dead_letters.held())
        want &= assigned
        if to_pause := want - self._paused:
            self._client.pause(*to_pause)
            log.info("paused %s until their rows are written", sorted(_name(t) for t in to_pause))
        if to_resume := (self._paused - want) & assigned:
            self._client.resume(*to_resume)
            log.info("resumed %s", sorted(_name(t) for t in to_resume))
        self._paused = want
        self.metrics.paused_partitions.set(len(want))

    async def _update_lag(self) -> None:
        """Lag = end offset - offset this member would commit now (held records count as not consumed). Paused
        partitions are not fetched, so their end offsets are asked for explicitly (at most every 2 s)."""
        assigned = self._client.assignment()
        ends: dict[TopicPartition, int] = {}
        paused = [tp for tp in self._paused if tp in assigned]
        now = self._clock()
        if paused and now - self._last_end_offsets >= _END_OFFSETS_EVERY_S:
            self._last_end_offsets = now
            try:
                ends.update(await self._client.end_offsets(paused))
            except KafkaError as exc:
                log.debug("end offsets of paused partitions unavailable: %s", exc)
        safe = self._ledger.safe(self._held())
        for tp in self._client.assignment():
            high = ends.get(tp, self._client.highwater(tp))
            pos = safe.get(tp, self._ledger.committed_offset(tp))
            if high is not None and pos is not None:
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(max(0, high - pos))

    def _log_progress(self) -> None:
        """One INFO line per ``_PROGRESS_EVERY_S`` while something happened: rows, waiting groups, paused partitions."""
        now = self._clock()
        if now - self._last_progress < _PROGRESS_EVERY_S:
            return
        self._last_progress = now
        applied = _total(self.metrics.rows_applied)
        waiting = self._scheduler.waiting_groups()
        if applied == self._last_applied and not waiting:
            return
        log.info(
            "applied %d rows since the last report; %d groups waiting for a shard, %d partitions paused",
            applied - self._last_applied,
            waiting,
            len(self._paused),
        )
        self._last_applied = applied

    # -- rebalance ----------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop everything uncommitted (partitions revoked, or a commit found this member out of the group)."""
        self._catch_ups.cancel()  # a new owner (maybe this one) judges the replicas afresh
        self._book = PositionBook()
        self._generation += 1
        self._scheduler.reset()
        self._dead_letters.reset()
        self._ledger.reset()
        self._paused.clear()
        self.metrics.paused_partitions.set(0)

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        """Nothing is committed here (records may be mid-write): everything uncommitted is replayed."""
        if not revoked:
            return
        log.info("partitions revoked: %s", sorted(_name(tp) for tp in revoked))
        self.reset()

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        """Start every assigned partition at its committed offset, so rows dropped by a rebalance are replayed;
        the first non-empty assignment with ``replay_ms`` then goes back to that time (:meth:`_replay`)."""
        log.info("assigned partitions: %s", sorted(_name(tp) for tp in assigned))
        for tp in assigned:
            try:
                committed = await self._client.committed(tp)
            except KafkaError as exc:  # the default position (committed or reset policy) still applies
                log.warning("cannot read committed offset of %s: %s", _name(tp), exc)
                continue
            if committed is not None:
                self._client.seek(tp, committed)
                self._ledger.committed({tp: committed})
        if self._replay_ms is not None and assigned:
            await self._replay(assigned, self._replay_ms)
            self._replay_ms = None  # the first assignment only
        for tp in assigned:  # the live loop writes everything from here on to every replica
            try:
                start = await self._client.position(tp)
            except KafkaError as exc:  # positions stay unknown: replicas' positions do not move meanwhile
                log.warning("cannot read the position of %s: %s", _name(tp), exc)
                continue
            self._book.live_from(stream_partition_key(tp.topic, tp.partition), start)

    async def _replay(self, assigned: list[TopicPartition], since_ms: int) -> None:
        """Seek each partition to its first record at/after ``since_ms`` (the end if none), never past its commit."""
        try:
            found = await self._client.offsets_for_times(dict.fromkeys(assigned, since_ms))
            ends = await self._client.end_offsets(assigned)
            committed = {tp: await self._client.committed(tp) for tp in assigned}
        except KafkaError as exc:  # listener errors are only logged by aiokafka: stop run() with it instead
            log.error("replay since %s: cannot look up offsets: %r; stopping", iso_ms(since_ms), exc)
            self.fatal = exc
            self.stop()
            return
        for tp in sorted(assigned):
            hit = found.get(tp)
            target = ends[tp] if hit is None else hit.offset
            was = committed[tp]
            if was is not None and was < target:
                target = was  # records after the commit were never applied: never skip them
            self._client.seek(tp, target)
            log.info(
                "replay since %s: %s from offset %s to %d",
                iso_ms(since_ms),
                _name(tp),
                "none (uncommitted)" if was is None else was,
                target,
            )


def _unique_records(records: list[Any]) -> list[Any]:
    seen: set[tuple[str, int, int]] = set()
    out = []
    for r in records:
        k = (r.topic, r.partition, r.offset)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def _name(tp: TopicPartition) -> str:
    return f"{tp.topic}[{tp.partition}]"


def iso_ms(ms: int) -> str:
    """``ms`` since the epoch as an ISO 8601 UTC time with milliseconds."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _total(counter: Counter) -> float:
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))
