"""Replay one PS replica alone from the stream position it reports, up to where the live loop took over.

:func:`catch_up` runs as a task of the updater when :class:`updater.replicas.PositionBook` found a replica behind
(it restarted or loaded a new version: its position went back). It asks the replica's ``stream_position``, reads the
partition with its own group-less consumer from the lowest position of the replica's tables up to ``end`` (the
live loop's next offset when the catch-up started: the live loop writes everything after it to every replica),
and writes the replica's rows, coalesced per table, to that replica only, each write recording how far it got.
Every other replica keeps receiving live writes meanwhile; rows are versioned, so the replayed and live writes may
interleave in any order. A replica that falls back again during the catch-up (it restarted once more, losing the
live writes it had received meanwhile) restarts it, up to where the live loop is by then: found by a write (the
replica had less than this catch-up wrote) or by the positions read as a round starts (below where the previous
round left them); a down replica is retried with the usual backoff. If the live loop read past ``end`` meanwhile,
those records are replayed too (their live writes reached the replica's rows but could not move its positions).
Finally every table's position is set to ``end`` (a write without rows) and the replica is handed back to the live
bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.deltas import DeltaError, EmbeddingDelta
from schemas.manifest import Manifest, stream_partition_key
from schemas.updater_settings import RetrySettings
from updater.apply import GroupKey, ShardWriter, WriteGroup
from updater.batch import GroupBuffer, coalesce, split_by_shard
from updater.errors import ApplyError
from updater.metrics import UpdaterMetrics
from updater.replicas import PositionBook, Replica
from updater.scheduler import backoff_s

__all__ = ["CatchUpTasks", "catch_up"]

log = logging.getLogger("embedgate.updater.catchup")

_MAX_RESTARTS = 20
_MAX_EXTENSIONS = 3  # rounds replaying what the live loop read during the previous round (see catch_up)
_BATCH = 512


class _FellBack(Exception):
    """The replica reported a position below what this catch-up already wrote: it restarted again."""


async def catch_up(
    *,
    replica: Replica,
    tp: TopicPartition,
    end: int,
    hint: int,
    manifest: Manifest,
    writer: ShardWriter,
    book: PositionBook,
    decode: Callable[[Any], EmbeddingDelta | None],
    consumer_factory: Callable[[], AIOKafkaConsumer],
    retry: RetrySettings,
    stop: asyncio.Event,
    live_end: Callable[[], int] | None = None,
    fell_back: Callable[[], None] | None = None,
) -> None:
    """Bring ``replica`` up to ``end`` on ``tp`` (see the module doc); ``hint`` = the position it reported when it
    was found behind. Returns when done, or when ``stop`` is set (then the replica stays marked for a later try).
    ``fell_back()`` is called each time the replica is found behind again and the catch-up starts over.

    ``live_end()`` is where the live loop has read ``tp`` up to now. A replica that falls back again during the
    catch-up (it restarted once more) lost the live writes it received meanwhile, which are beyond ``end``: the
    catch-up starts again up to ``live_end()`` (the live loop's rows from there on reach it as before). A replay
    that ends with the live loop past ``end`` is extended to ``live_end()`` (at most ``_MAX_EXTENSIONS`` times):
    the live writes made meanwhile could not move the replica's positions. Under a stream that never pauses the
    positions then move on with the next live write of each table, as they do for any replica.

    A fall-back is found by a write (the replica answers less than this catch-up wrote) or by the positions read as
    a round starts (below ``floor``, where the previous round left every table): a replica that restarted between
    two rounds lost the live writes it received after the previous round's ``live_end()``, so the next round must
    not stop at that ``end`` (with no extension left its positions would be set to it without those rows)."""
    key = stream_partition_key(tp.topic, tp.partition)
    tables = [t.name for t in manifest.tables]
    extensions = replayed = 0
    # every table's position when the previous round ended (-1: no round ended since the catch-up (re)started)
    floor = -1
    for attempt in range(_MAX_RESTARTS + _MAX_EXTENSIONS):
        if stop.is_set():
            return
        try:
            replayed += await _run(
                replica, tp, key, end, hint, floor, manifest, writer, decode, consumer_factory, retry, stop
            )
        except _FellBack as exc:
            if fell_back is not None:
                fell_back()
            if live_end is not None:  # read after the fall-back was seen: beyond every live write it lost
                end = max(end, live_end())
            log.warning(
                "catch-up of %s on %s: %s; starting again up to offset %d (attempt %d)",
                _name(replica),
                key,
                exc,
                end,
                attempt + 2,
            )
            hint = floor = -1
            continue
        if stop.is_set():
            return
        floor = end  # the round set every table's position to at least ``end``
        now = live_end() if live_end is not None else end
        if now > end and extensions < _MAX_EXTENSIONS:
            # The live loop wrote records from ``end`` on to this replica during the replay: their rows reached it,
            # but not their positions (each write expected more than it stored then). Replay those records too, so
            # that its positions end where the live loop is, as its peers' do; otherwise a table the stream does not
            # write again would keep the lower position for good (and a gateway would see the replica behind).
            log.info(
                "catch-up of %s on %s: the live loop moved on to offset %d meanwhile; replaying up to it",
                _name(replica),
                key,
                now,
            )
            end, hint, extensions = now, -1, extensions + 1
            continue
        book.caught_up(replica, key, tables, end)
        log.info("caught up %s on %s to offset %d (%d rows replayed)", _name(replica), key, end, replayed)
        return
    log.error("catch-up of %s on %s gave up after %d restarts", _name(replica), key, _MAX_RESTARTS)
    book.abandon(replica, key)


async def _run(
    replica: Replica,
    tp: TopicPartition,
    key: str,
    end: int,
    hint: int,
    floor: int,
    manifest: Manifest,
    writer: ShardWriter,
    decode: Callable[[Any], EmbeddingDelta | None],
    consumer_factory: Callable[[], AIOKafkaConsumer],
    retry: RetrySettings,
    stop: asyncio.Event,
) -> int:
    reported = await _retrying(lambda: writer.stream_position(replica), retry, stop)
    if reported is None:
        return 0
    progress = {t.name: reported.get(t.name, {}).get(key, -1) for t in manifest.tables}
    for table, had in progress.items():
        if had < floor:
            raise _FellBack(
                f"table {table!r} reported position {had}, below {floor} where the last round left it"
            )
    start = min([*progress.values(), hint]) if hint >= 0 else min(progress.values())
    consumer = consumer_factory()
    replayed = 0
    try:  # start inside: a catch-up cancelled while connecting still closes what it opened
        await consumer.start()
        consumer.assign([tp])
        if start < 0:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, start)
        first = await consumer.position(tp)
        log.info("catch-up of %s on %s: replaying offsets %d..%d", _name(replica), key, first, end)
        progress = {t: max(p, -1) for t, p in progress.items()}
        while not stop.is_set() and await consumer.position(tp) < end:
            got = await consumer.getmany(tp, timeout_ms=500, max_records=_BATCH)
            records = [r for r in got.get(tp, []) if r.offset < end]
            if not records:
                continue
            batch_end = records[-1].offset + 1
            buffers: dict[str, GroupBuffer] = {}
            for rec in records:
                try:
                    delta = decode(rec)
                except DeltaError:
                    continue  # the live loop dead-letters it
                if delta is None or delta.model != replica.model:
                    continue
                for shard, ids, values in split_by_shard(delta, manifest.num_shards):
                    if shard != replica.shard:
                        continue
                    buf = buffers.get(delta.table)
                    if buf is None:
                        gk = GroupKey(replica.model, replica.shard, delta.table)
                        buf = buffers[delta.table] = GroupBuffer(key=gk, dim=manifest.table(delta.table).dim)
                    buf.add(ids, values, delta.timestamp_ms, rec, delta.sequence)
            for buf in buffers.values():
                group = buf.build()
                group.positions = {key: batch_end}
                await _write(replica, group, progress, key, writer, retry, stop)
                replayed += group.row_count
        for table in progress:  # tables without rows since their position: only the position moves
            if progress[table] < end and not stop.is_set():
                empty = WriteGroup(
                    key=GroupKey(replica.model, replica.shard, table),
                    rows=coalesce([], manifest.table(table).dim),
                    positions={key: end},
                )
                await _write(replica, empty, progress, key, writer, retry, stop)
    finally:
        await consumer.stop()
    return replayed


async def _write(
    replica: Replica,
    group: WriteGroup,
    progress: dict[str, int],
    key: str,
    writer: ShardWriter,
    retry: RetrySettings,
    stop: asyncio.Event,
) -> None:
    table = group.key.table
    expected = {key: progress[table]}
    previous = await _retrying(lambda: writer.write_replica(replica.target, group, expected), retry, stop)
    if previous is None:
        return
    had = previous.get(key, -1)
    if had < progress[table]:
        raise _FellBack(f"table {table!r} reported position {had}, below {progress[table]}")
    progress[table] = max(had, group.positions[key])


async def _retrying(call: Callable[[], Any], retry: RetrySettings, stop: asyncio.Event) -> Any:
    """``await call()`` until it succeeds; retriable ApplyErrors wait with backoff; None once ``stop`` is set."""
    attempts = 0
    while not stop.is_set():
        try:
            return await call()
        except ApplyError as exc:
            if not exc.retriable:
                raise
            attempts += 1
            if attempts == 1 or attempts % 10 == 0:
                log.warning("catch-up write failed (attempt %d): %s", attempts, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff_s(attempts, retry))
    return None


def _name(replica: Replica) -> str:
    return f"{replica.model}_ps_{replica.shard}@{replica.target}"


class CatchUpTasks:
    """The catch-ups running in the background, at most one per (replica, partition key); each a :func:`catch_up`
    task with this updater's ``writer``, ``decode``, group-less ``consumer_factory`` and ``retry`` policy. A task
    that fails is logged and abandoned in its book (the next write to the replica judges it afresh). Not task-safe:
    one event loop.

    ``embedgate_updater_replica_catchups_total`` counts the replays started because a replica was found behind:
    each :meth:`start`, and each time a running catch-up finds its replica behind again and starts over (it
    restarted once more). Extending a replay to where the live loop moved meanwhile is not counted."""

    def __init__(
        self,
        *,
        manifests: Mapping[str, Manifest],
        writer: ShardWriter,
        decode: Callable[[Any], EmbeddingDelta | None],
        consumer_factory: Callable[[], AIOKafkaConsumer],
        retry: RetrySettings,
        stop: asyncio.Event,
        metrics: UpdaterMetrics,
    ) -> None:
        self._manifests = manifests
        self._writer = writer
        self._decode = decode
        self._consumer_factory = consumer_factory
        self._retry = retry
        self._stop = stop
        self._metrics = metrics
        self._tasks: dict[tuple[Replica, str], asyncio.Task[None]] = {}

    def start(
        self,
        book: PositionBook,
        replica: Replica,
        key: str,
        had: int,
        end: int,
        live_end: Callable[[], int] | None = None,
    ) -> None:
        """``replica`` reported position ``had`` on partition ``key``, below what it had acknowledged (it restarted
        or loaded another version): replay it alone up to ``end`` (where the live loop is now; ``live_end()`` says
        where it is later, see :func:`catch_up`).

        The book marks a replica found behind only while no catch-up of it runs (a running one moves its positions
        and finds a fall-back itself), so a task still registered here has already handed the replica back (or
        given up) and only its done callback is pending: the replica fell behind again right after, and gets a
        catch-up of its own. (A registered task still running would be cancelled: the new one replays from the
        positions the replica reports, which cover what the old one wrote.)"""
        previous = self._tasks.get((replica, key))
        if previous is not None:
            previous.cancel()  # a no-op once it has ended
        topic, _, part = key.rpartition(":")
        log.warning(
            "%s is behind on %s (position %d): replaying it alone up to offset %d",
            _name(replica),
            key,
            had,
            end,
        )
        counted = self._metrics.catchups.labels(replica.model, str(replica.shard))
        counted.inc()
        task = asyncio.create_task(
            catch_up(
                replica=replica,
                tp=TopicPartition(topic, int(part)),
                end=end,
                hint=had,
                manifest=self._manifests[replica.model],
                writer=self._writer,
                book=book,
                decode=self._decode,
                consumer_factory=self._consumer_factory,
                retry=self._retry,
                stop=self._stop,
                live_end=live_end,
                fell_back=counted.inc,
            ),
            name=f"catch-up {replica} {key}",
        )
        self._tasks[(replica, key)] = task
        task.add_done_callback(functools.partial(self._done, (replica, key), book))

    def _done(self, k: tuple[Replica, str], book: PositionBook, task: asyncio.Task[None]) -> None:
        current = self._tasks.get(k) is task  # else cancelled, or replaced by a newer catch-up of the replica
        if current:
            del self._tasks[k]
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            log.error(
                "catch-up of %s on %s failed: %r; it is retried on the next write", _name(k[0]), k[1], exc
            )
            if current:  # a newer catch-up owns the replica's book entry
                book.abandon(*k)

    def cancel(self) -> None:
        """Cancel every catch-up (partitions revoked: a new owner, maybe this one, judges the replicas afresh)."""
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    async def close(self) -> None:
        """Cancel every catch-up and wait for them to end."""
        tasks = list(self._tasks.values())
        self.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
