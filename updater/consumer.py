"""The updater's loop: consume deltas, apply them to every PS replica, commit offsets only after the writes.

:class:`Updater` composes an aiokafka consumer group member (``enable_auto_commit=False``), a dead-letter producer,
a :class:`updater.apply.ShardWriter` and :class:`updater.metrics.UpdaterMetrics`. One iteration of :meth:`run`:

1. **fetch** up to ``batch.max_messages`` messages, waiting at most ``batch.max_delay_ms`` once a record arrived;
2. **decode + validate** every record (binary/JSON deltas on ``topics``, HPS records on ``hps_et.*``): invalid ones
   are produced to the dead-letter topic with the reason in headers and count as done; HPS beacons are skipped;
3. **group** valid rows per (model, shard, table), last value per id wins, in arrival order; a group whose key is
   already waiting for a retry is appended to the waiting group (ordering per shard is kept);
4. **apply** due groups concurrently, every replica of the shard; a retriable failure keeps the group waiting with
   exponential backoff (``retry.*``) and **pauses** every partition it holds records of; a rejected write
   dead-letters the group's messages (reason ``apply_rejected``);
5. **commit**, per partition, the lowest offset still waiting (or the next offset when nothing waits), and resume
   partitions with nothing waiting.

Offsets are therefore committed only for records whose rows every replica acknowledged (or that were dead-lettered):
at-least-once. Because rows are absolute and each shard's messages share one partition, replaying from the committed
offset converges to the last published value per key. :meth:`stop` (SIGTERM) lets the iteration in flight finish,
commits and leaves the group. A rebalance drops everything uncommitted; the new owner replays it.

**Replay** (``replay_since``, resolved once at startup by :func:`replay_timestamp_ms`): on this process's first
non-empty partition assignment every assigned partition is sought to its first record at or after that time
(``offsets_for_times``; the end offset when no record is that new), but never past its committed offset (records
after it were never applied). The loop then applies and commits as usual, so the committed offsets move back. This
restores rows a restarted PS replica lost: they are absolute, replaying them is harmless. Later rebalances start at
the committed offsets as always. A failed lookup stops the updater with the Kafka error (nothing is skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter

from schemas.deltas import (
    DeltaError,
    EmbeddingDelta,
    check_against_manifest,
    decode_delta,
    decode_hps,
    shard_partition,
)
from schemas.deployment import EmbeddingModel
from schemas.manifest import Manifest, ManifestError, stream_partition_key
from schemas.partition import shard_for
from schemas.updater_settings import UpdaterSettings, parse_replay_since
from updater.apply import GroupKey, ShardWriter
from updater.batch import GroupBuffer, split_by_shard
from updater.catchup import catch_up
from updater.errors import ApplyError, ConfigError, KafkaAction, kafka_action
from updater.kafka_security import client_kwargs
from updater.ledger import OffsetLedger
from updater.membership import check_group
from updater.metrics import UpdaterMetrics
from updater.replicas import PositionBook, Replica
from updater.resume import seed_committed_offsets
from updater.scheduler import backoff_s

__all__ = ["Updater", "load_models", "replay_timestamp_ms"]

log = logging.getLogger("embedgate.updater")

_HPS_RE = re.compile(r"^hps_et\.")
_PROGRESS_EVERY_S = 30.0
_REPLICA_CHECK_S = 5.0  # how often replicas' stream positions are compared with what they acknowledged


@dataclass(frozen=True)
class _Route:
    config: EmbeddingModel
    manifest: Manifest


def load_models(models: Sequence[EmbeddingModel]) -> dict[str, _Route]:
    """Read each model's manifest and check its shard list matches the manifest's partition; ConfigError if not."""
    routes: dict[str, _Route] = {}
    for m in models:
        try:
            manifest = Manifest.load(m.manifest)
        except ManifestError as exc:
            raise ConfigError(f"model {m.name!r}: {exc}") from exc
        if manifest.model_name != m.name:
            raise ConfigError(
                f"model {m.name!r}: manifest {m.manifest} describes model {manifest.model_name!r}"
            )
        if len(m.shards) != manifest.num_shards:
            raise ConfigError(
                f"model {m.name!r}: {len(m.shards)} shards configured, the manifest has {manifest.num_shards}"
            )
        routes[m.name] = _Route(m, manifest)
    return routes


def replay_timestamp_ms(value: str, models: Sequence[EmbeddingModel], *, now: float | None = None) -> int:
    """The ``replay_since`` time in ms since the epoch (``now`` defaults to the current time). ``export`` is the
    oldest, over every model and shard, of the newest PS version directory's mtime (``<model dir>/ps_<i>/<n>/``
    next to the manifest: when that snapshot was published); ConfigError when a model has none."""
    seconds = parse_replay_since(value, now=time.time() if now is None else now)
    if seconds is None:
        times = []
        for m in models:
            model_dir = Path(m.manifest) if Path(m.manifest).is_dir() else Path(m.manifest).parent
            for shard in range(len(m.shards)):
                ps_dir = model_dir / f"ps_{shard}"
                try:
                    versions = [d for d in ps_dir.iterdir() if d.name.isdigit() and d.is_dir()]
                except OSError as exc:
                    raise ConfigError(
                        f"replay_since {value!r}: model {m.name!r}: cannot list {ps_dir}: {exc}"
                    ) from exc
                if not versions:
                    raise ConfigError(
                        f"replay_since {value!r}: model {m.name!r}: no PS version directory in {ps_dir}"
                    )
                times.append(max(versions, key=lambda d: int(d.name)).stat().st_mtime)
        if not times:
            raise ConfigError(f"replay_since {value!r}: no PS shard configured")
        seconds = min(times)
    return int(seconds * 1000)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, updater: Updater) -> None:
        self._updater = updater

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._updater._on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("assigned partitions: %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))
        await self._updater._on_assigned(list(assigned))


class Updater:
    """One updater process's consumer loop. Call :meth:`run` once (it owns start and stop of every client);
    :meth:`stop` may be called from a signal handler in the same loop. Not reusable after run returns."""

    def __init__(self, settings: UpdaterSettings, *, metrics: UpdaterMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or UpdaterMetrics()
        self._routes = load_models(settings.embedding_models)
        self._writer = ShardWriter(
            [r.config for r in self._routes.values()],
            deadline_s=settings.apply_deadline_s,
            max_rows_per_call=settings.batch.max_rows_per_call,
            tls=settings.backend_tls,
        )
        self._kafka_security = client_kwargs(settings.kafka_security())  # reads the password file now
        self._stop = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._dlq: AIOKafkaProducer | None = None
        self._waiting: dict[GroupKey, GroupBuffer] = {}
        self._ledger = OffsetLedger()
        self._paused: set[TopicPartition] = set()
        self._generation = 0
        self._last_progress = time.monotonic()
        self._last_applied = 0.0
        self._last_end_offsets = 0.0
        self._replay_ms: int | None = None  # replay_since, until the first assignment was sought there
        if settings.replay_since is not None:
            self._replay_ms = replay_timestamp_ms(settings.replay_since, settings.embedding_models)
            log.info(
                "replay since %s (%s) on the first assignment", _iso(self._replay_ms), settings.replay_since
            )
        self._fatal: KafkaError | None = None
        self._book = PositionBook()
        self._catchups: dict[tuple[Replica, str], asyncio.Task[None]] = {}
        self._last_replica_check = time.monotonic()
        self.ready = asyncio.Event()

    # -- life cycle -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`run` to finish the iteration in flight, commit and leave the group."""
        self._stop.set()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns now (empty before the first assignment and after :meth:`run`)."""
        if self._consumer is None:
            return set()
        return set(self._consumer.assignment())

    async def run(self) -> None:
        s = self.settings
        if s.create_topics:
            await self._ensure_topics()
        try:
            await self._preflight()
        except BaseException:
            await self._writer.close()
            raise
        self._dlq = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap_servers,
            client_id=f"{s.client_id}-dlq",
            **self._kafka_security,
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers,
            group_id=s.consumer_group,
            client_id=s.client_id,
            **self._kafka_security,
            enable_auto_commit=False,
            auto_offset_reset=s.auto_offset_reset,
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            metadata_max_age_ms=s.metadata_max_age_ms,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
        )
        await self._dlq.start()
        try:
            await self._consumer.start()
            try:
                listener = _Listener(self)
                if s.hps_pattern:
                    parts = [re.escape(t) for t in s.delta_topics] + [f"(?:{s.hps_pattern})"]
                    self._consumer.subscribe(pattern=f"^(?:{'|'.join(parts)})$", listener=listener)
                else:
                    self._consumer.subscribe(topics=s.delta_topics, listener=listener)
                self.ready.set()
                await self._loop()
                await self._commit()
                await self._stop_catchups()
                if self._fatal is not None:
                    raise self._fatal
            finally:
                await self._consumer.stop()  # leaves the group
        finally:
            await self._dlq.stop()
            await self._writer.close()

    async def _preflight(self) -> None:
        """Before joining the group: refuse a group whose active members consume other topics
        (:mod:`updater.membership`, ConfigError); partitions the group never committed start at the replicas' stream
        positions (:mod:`updater.resume`)."""
        s = self.settings
        await check_group(
            bootstrap_servers=s.bootstrap_servers,
            group_id=s.consumer_group,
            client_id=s.client_id,
            topics=s.delta_topics,
            hps_pattern=s.hps_pattern,
            kafka_kwargs=self._kafka_security,
        )
        await seed_committed_offsets(
            bootstrap_servers=s.bootstrap_servers,
            group_id=s.consumer_group,
            client_id=s.client_id,
            topics=s.delta_topics,
            models={name: (r.config, r.manifest) for name, r in self._routes.items()},
            position=self._writer.stream_position,
            kafka_kwargs=self._kafka_security,
        )

    async def _ensure_topics(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        s = self.settings
        admin = AIOKafkaAdminClient(
            bootstrap_servers=s.bootstrap_servers, client_id=f"{s.client_id}-admin", **self._kafka_security
        )
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            wanted = [t for t in [*s.delta_topics, s.dead_letter_topic] if t not in existing]
            most_shards = max(r.manifest.num_shards for r in self._routes.values())
            if wanted:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(
                        [
                            NewTopic(
                                t,
                                num_partitions=max(s.topic_partitions, most_shards),
                                replication_factor=s.topic_replication_factor,
                            )
                            for t in wanted
                        ]
                    )
                log.info("created topics %s", wanted)
        finally:
            await admin.close()

    # -- the loop ---------------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        assert self._consumer is not None
        while not self._stop.is_set():
            generation = self._generation
            records = await self._fetch()
            if generation != self._generation:
                self._rewind(records)  # a rebalance happened while fetching: read them again
                continue
            fresh = await self._ingest(records)
            await self._apply_due(fresh, generation)
            if generation != self._generation:
                continue
            await self._commit()
            self._update_pauses()
            await self._update_lag()
            await self._check_replicas()
            self._log_progress()

    def _log_progress(self) -> None:
        """One INFO line per ``_PROGRESS_EVERY_S`` while something happened: rows, waiting groups, paused partitions."""
        now = time.monotonic()
        if now - self._last_progress < _PROGRESS_EVERY_S:
            return
        self._last_progress = now
        applied = _total(self.metrics.rows_applied)
        if applied == self._last_applied and not self._waiting:
            return
        log.info(
            "applied %d rows since the last report; %d groups waiting for a shard, %d partitions paused",
            applied - self._last_applied,
            len(self._waiting),
            len(self._paused),
        )
        self._last_applied = applied

    def _fetch_timeout_s(self) -> float:
        timeout = 0.2
        if self._waiting:
            next_try = min(b.next_try for b in self._waiting.values())
            timeout = min(timeout, max(0.0, next_try - time.monotonic()))
        return timeout

    async def _fetch(self) -> list[Any]:
        """Records in partition order; waits up to ``batch.max_delay_ms`` after the first one for more."""
        assert self._consumer is not None
        s = self.settings.batch
        out: list[Any] = []
        count = 0
        deadline: float | None = None
        for _ in range(1000):  # bounded: each pass either waits or gathers records
            timeout = self._fetch_timeout_s() if deadline is None else max(0.0, deadline - time.monotonic())
            got = await self._consumer.getmany(
                timeout_ms=int(timeout * 1000), max_records=max(1, s.max_messages - count)
            )
            for tp, recs in got.items():
                out.extend(recs)
                count += len(recs)
                if recs:
                    self._ledger.fetched(tp, recs[-1].offset + 1)
            if not out or count >= s.max_messages or self._stop.is_set():
                break
            if deadline is None:
                deadline = time.monotonic() + s.max_delay_ms / 1000
            if time.monotonic() >= deadline:
                break
        return out

    async def _ingest(self, records: list[Any]) -> dict[GroupKey, GroupBuffer]:
        """Decode, validate, route; dead-letter invalid records; return the new groups not already waiting."""
        fresh: dict[GroupKey, GroupBuffer] = {}
        dead: list[tuple[Any, DeltaError]] = []
        for rec in records:
            try:
                delta = self._decode(rec)
            except DeltaError as exc:
                dead.append((rec, exc))
                continue
            if delta is None:
                continue
            route = self._routes[delta.model]
            for shard, ids, values in split_by_shard(delta, route.manifest.num_shards):
                key = GroupKey(delta.model, shard, delta.table)
                buf = fresh.get(key)
                if buf is None:
                    buf = fresh[key] = GroupBuffer(key=key, dim=route.manifest.table(delta.table).dim)
                buf.add(ids, values, delta.timestamp_ms, rec, delta.sequence)
        if dead:
            await self._dead_letter(dead)
        ready: dict[GroupKey, GroupBuffer] = {}
        for key, buf in fresh.items():
            if key in self._waiting:
                self._waiting[key].absorb(buf)  # keep per-shard order behind the waiting rows
            else:
                ready[key] = buf
        return ready

    def _decode(self, rec: Any, *, count: bool = True) -> EmbeddingDelta | None:
        if _HPS_RE.match(rec.topic):
            delta = decode_hps(
                rec.topic, rec.value, key=rec.key, timestamp_ms=rec.timestamp, sequence=rec.offset
            )
            if delta is None:
                if count:
                    self.metrics.messages.labels("beacon").inc()
                return None
            kind = "hps"
        else:
            delta = decode_delta(rec.value)
            kind = "delta"
        route = self._routes.get(delta.model)
        if route is None:
            raise DeltaError(
                "unknown_model", f"unknown model {delta.model!r} (configured: {sorted(self._routes)})"
            )
        check_against_manifest(delta, route.manifest)
        self._check_partition(rec, delta, route.manifest.num_shards)
        if count:
            self.metrics.messages.labels(kind).inc()
        return delta

    def _check_partition(self, rec: Any, delta: EmbeddingDelta, num_shards: int) -> None:
        """DeltaError ``wrong_partition`` unless every row's shard ``s`` maps to this record's partition
        (``s % P``): a message elsewhere could overtake, or be overtaken by, the shard's other messages."""
        assert self._consumer is not None
        partitions = self._consumer.partitions_for_topic(rec.topic)
        if not partitions:
            return  # no metadata (cannot happen for an assigned partition): nothing to check against
        count = len(partitions)
        shards = np.unique(shard_for(delta.ids, num_shards))
        wrong = [int(sh) for sh in shards if shard_partition(int(sh), count) != rec.partition]
        if wrong:
            raise DeltaError(
                "wrong_partition",
                f"rows of {delta.model} shard {wrong[0]} belong in partition "
                f"{shard_partition(wrong[0], count)} of {count} ({rec.topic}), found in partition {rec.partition}; "
                "producers must send shard s to partition s % partitions",
            )

    async def _dead_letter(self, dead: list[tuple[Any, DeltaError]]) -> None:
        """Produce each record to the dead-letter topic with the reason; returns once the broker acknowledged all."""
        assert self._dlq is not None
        futures = []
        for rec, exc in dead:
            self.metrics.messages.labels("invalid").inc()
            log.warning(
                "dead-letter %s[%d]@%d: %s: %s", rec.topic, rec.partition, rec.offset, exc.reason, exc
            )
            headers = [
                ("embedgate.reason", exc.reason.encode()),
                ("embedgate.error", str(exc).encode("utf-8", "replace")[:4000]),
                ("embedgate.topic", rec.topic.encode()),
                ("embedgate.partition", str(rec.partition).encode()),
                ("embedgate.offset", str(rec.offset).encode()),
            ]
            futures.append(
                await self._dlq.send(
                    self.settings.dead_letter_topic, value=rec.value, key=rec.key, headers=headers
                )
            )
        await asyncio.gather(*futures)
        for _, exc in dead:
            self.metrics.dead_letters.labels(exc.reason).inc()

    async def _apply_due(self, fresh: dict[GroupKey, GroupBuffer], generation: int) -> None:
        now = time.monotonic()
        due = list(fresh.values()) + [b for b in self._waiting.values() if b.next_try <= now]
        if not due:
            return
        results = await asyncio.gather(*(self._apply_one(b) for b in due))
        if generation != self._generation:
            return  # partitions were revoked meanwhile: the new owner replays everything uncommitted
        rejected: list[tuple[Any, DeltaError]] = []
        for buf, err in zip(due, results, strict=True):
            if err is None:
                self._waiting.pop(buf.key, None)
            elif err.retriable:
                buf.attempts += 1
                buf.next_try = time.monotonic() + backoff_s(buf.attempts, self.settings.retry)
                if buf.key not in self._waiting:
                    self._waiting[buf.key] = buf
                if buf.attempts == 1 or buf.attempts % 10 == 0:
                    log.warning(
                        "shard write failed (attempt %d, %d rows waiting): %s", buf.attempts, buf.rows, err
                    )
            else:
                self._waiting.pop(buf.key, None)
                log.error("shard write rejected, dead-lettering %d messages: %s", len(buf.records), err)
                reason = DeltaError("apply_rejected", str(err))
                rejected.extend((rec, reason) for rec in _unique_records(buf.records))
        if rejected:
            await self._dead_letter(rejected)

    async def _apply_one(self, buf: GroupBuffer) -> ApplyError | None:
        group = buf.build()
        group.positions = buf.positions()
        model, shard, table = buf.key.model, buf.key.shard, buf.key.table

        def expected(target: str) -> dict[str, int]:
            replica = Replica(target, model, shard)
            return {k: self._book.expected(replica, table, k) for k in group.positions}

        t0 = time.perf_counter()
        try:
            answers = await self._writer.apply(group, expected)
        except ApplyError as exc:
            self.metrics.apply_failures.labels(model, str(buf.key.shard), str(exc.retriable).lower()).inc()
            return exc
        self.metrics.apply_latency.labels(model).observe(time.perf_counter() - t0)
        for target, previous in answers.items():
            replica = Replica(target, model, shard)
            for key, had in self._book.acknowledged(replica, table, group.positions, previous).items():
                self._start_catch_up(replica, key, had)
        if len(group.upsert_ids):
            self.metrics.rows_applied.labels(model, buf.key.table, "upsert").inc(len(group.upsert_ids))
        if len(group.delete_ids):
            self.metrics.rows_applied.labels(model, buf.key.table, "delete").inc(len(group.delete_ids))
        now_ms = time.time() * 1000
        for ts in buf.timestamps_ms:
            if ts > 0:
                self.metrics.freshness.labels(model).observe(max(0.0, (now_ms - ts) / 1000))
        return None

    # -- replicas that fell behind ----------------------------------------------------------------------------
    def _start_catch_up(self, replica: Replica, key: str, had: int) -> None:
        """``replica`` reported position ``had`` on ``key``, below what it had acknowledged: it restarted or loaded
        another version. Replay it alone, in the background, up to where the live loop is now."""
        if (replica, key) in self._catchups:
            return
        topic, _, part = key.rpartition(":")
        tp = TopicPartition(topic, int(part))
        fetched = self._ledger.fetched_offset(tp)
        end = fetched if fetched is not None else self._ledger.committed_offset(tp) or 0
        log.warning(
            "%s_ps_%d at %s is behind on %s (position %d): replaying it alone up to offset %d",
            replica.model,
            replica.shard,
            replica.target,
            key,
            had,
            end,
        )
        self.metrics.catchups.labels(replica.model, str(replica.shard)).inc()
        s = self.settings
        task = asyncio.create_task(
            catch_up(
                replica=replica,
                tp=tp,
                end=end,
                hint=had,
                manifest=self._routes[replica.model].manifest,
                writer=self._writer,
                book=self._book,
                decode=lambda rec: self._decode(rec, count=False),
                consumer_factory=lambda: AIOKafkaConsumer(
                    bootstrap_servers=s.bootstrap_servers,
                    client_id=f"{s.client_id}-catchup",
                    group_id=None,
                    enable_auto_commit=False,
                    max_partition_fetch_bytes=8 * 1024 * 1024,
                    **self._kafka_security,
                ),
                retry=s.retry,
                stop=self._stop,
            ),
            name=f"catch-up {replica} {key}",
        )
        self._catchups[(replica, key)] = task
        task.add_done_callback(functools.partial(self._catch_up_done, (replica, key)))

    async def _check_replicas(self) -> None:
        """Every ``_REPLICA_CHECK_S``: ask each replica written so far for its ``stream_position``; one below what it
        acknowledged (it restarted or loaded another version while nothing was written to it) is caught up. A
        replica that does not answer is left to the write path (its writes are retried)."""
        now = time.monotonic()
        if now - self._last_replica_check < _REPLICA_CHECK_S:
            return
        self._last_replica_check = now
        snapshot = self._book.beliefs()
        if not snapshot:
            return
        replicas = list(snapshot)
        answers = await asyncio.gather(
            *(self._writer.stream_position(r) for r in replicas), return_exceptions=True
        )
        for replica, reported in zip(replicas, answers, strict=True):
            if isinstance(reported, BaseException):
                if not isinstance(reported, ApplyError):
                    raise reported
                log.debug("stream_position of %s: %s", replica, reported)
                continue
            for key, had in self._book.check(replica, snapshot[replica], reported).items():
                self._start_catch_up(replica, key, had)

    def _catch_up_done(self, k: tuple[Replica, str], task: asyncio.Task[None]) -> None:
        if self._catchups.get(k) is task:
            del self._catchups[k]
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            log.error("catch-up of %s on %s failed: %r; it is retried on the next write", k[0], k[1], exc)
            self._book.abandon(*k)

    async def _stop_catchups(self) -> None:
        tasks = list(self._catchups.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- offsets ----------------------------------------------------------------------------------------------
    def _waiting_offsets(self) -> list[tuple[TopicPartition, int]]:
        return [
            (TopicPartition(rec.topic, rec.partition), rec.offset)
            for buf in self._waiting.values()
            for rec in buf.records
        ]

    async def _commit(self) -> None:
        assert self._consumer is not None
        offsets = self._ledger.to_commit(self._waiting_offsets(), set(self._consumer.assignment()))
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            action = kafka_action(exc)
            if action is KafkaAction.FATAL:
                raise
            if action is KafkaAction.REJOIN:
                log.warning("commit failed (%r); uncommitted records will be redelivered", exc)
                self._reset_state()
            else:
                log.warning("commit failed (%r); will retry on the next iteration", exc)
            return
        self._ledger.committed(offsets)
        self.metrics.commits.inc()

    def _update_pauses(self) -> None:
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        want: set[TopicPartition] = set()
        for buf in self._waiting.values():
            for rec in buf.records:
                want.add(TopicPartition(rec.topic, rec.partition))
        want &= assigned
        if to_pause := want - self._paused:
            self._consumer.pause(*to_pause)
            log.info(
                "paused %s while a shard is unavailable",
                sorted(f"{t.topic}[{t.partition}]" for t in to_pause),
            )
        if to_resume := (self._paused - want) & assigned:
            self._consumer.resume(*to_resume)
            log.info("resumed %s", sorted(f"{t.topic}[{t.partition}]" for t in to_resume))
        self._paused = want
        self.metrics.paused_partitions.set(len(want))

    async def _update_lag(self) -> None:
        """Lag = end offset - offset this member would commit now (waiting records count as not consumed). Paused
        partitions are not fetched, so their end offsets are asked for explicitly (at most every 2 s)."""
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        ends: dict[TopicPartition, int] = {}
        paused = [tp for tp in self._paused if tp in assigned]
        now = time.monotonic()
        if paused and now - self._last_end_offsets >= 2.0:
            self._last_end_offsets = now
            try:
                ends.update(await self._consumer.end_offsets(paused))
            except KafkaError as exc:
                log.debug("end offsets of paused partitions unavailable: %s", exc)
        safe = self._ledger.safe(self._waiting_offsets())
        for tp in assigned:
            high = ends.get(tp, self._consumer.highwater(tp))
            pos = safe.get(tp, self._ledger.committed_offset(tp))
            if high is not None and pos is not None:
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(max(0, high - pos))

    def _rewind(self, records: list[Any]) -> None:
        """Seek every still-assigned partition back to the first of ``records`` (they were not processed)."""
        assert self._consumer is not None
        first: dict[TopicPartition, int] = {}
        for rec in records:
            tp = TopicPartition(rec.topic, rec.partition)
            first[tp] = min(first.get(tp, rec.offset), rec.offset)
        assigned = self._consumer.assignment()
        for tp, offset in first.items():
            self._ledger.forget(tp)
            if tp in assigned:
                self._consumer.seek(tp, offset)

    def _reset_state(self) -> None:
        for task in self._catchups.values():
            task.cancel()  # a new owner (maybe this one) judges the replicas afresh
        self._catchups.clear()
        self._book = PositionBook()
        self._generation += 1
        self._waiting.clear()
        self._ledger.reset()
        self._paused.clear()
        self.metrics.paused_partitions.set(0)

    async def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        # Nothing is committed here: records may be mid-write in the loop. Everything uncommitted is replayed.
        if not revoked:
            return
        log.info("partitions revoked: %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in revoked))
        self._reset_state()

    async def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        """Start every assigned partition at its committed offset, so rows dropped by a rebalance are replayed;
        the first non-empty assignment with ``replay_since`` then goes back to that time (:meth:`_replay`)."""
        assert self._consumer is not None
        for tp in assigned:
            try:
                committed = await self._consumer.committed(tp)
            except KafkaError as exc:  # the default position (committed or reset policy) still applies
                log.warning("cannot read committed offset of %s[%d]: %s", tp.topic, tp.partition, exc)
                continue
            if committed is not None:
                self._consumer.seek(tp, committed)
                self._ledger.committed({tp: committed})
        if self._replay_ms is not None and assigned:
            await self._replay(assigned, self._replay_ms)
            self._replay_ms = None  # the first assignment only
        for tp in assigned:  # the live loop writes everything from here on to every replica
            try:
                start = await self._consumer.position(tp)
            except KafkaError as exc:  # positions stay unknown: replicas' positions do not move meanwhile
                log.warning("cannot read the position of %s[%d]: %s", tp.topic, tp.partition, exc)
                continue
            self._book.live_from(stream_partition_key(tp.topic, tp.partition), start)

    async def _replay(self, assigned: list[TopicPartition], since_ms: int) -> None:
        """Seek each partition to its first record at/after ``since_ms`` (the end if none), never past its commit."""
        assert self._consumer is not None
        try:
            found = await self._consumer.offsets_for_times(dict.fromkeys(assigned, since_ms))
            ends = await self._consumer.end_offsets(assigned)
            committed = {tp: await self._consumer.committed(tp) for tp in assigned}
        except KafkaError as exc:  # listener errors are only logged by aiokafka: stop run() with it instead
            log.error("replay since %s: cannot look up offsets: %r; stopping", _iso(since_ms), exc)
            self._fatal = exc
            self.stop()
            return
        for tp in sorted(assigned):
            hit = found.get(tp)
            target = ends[tp] if hit is None else hit.offset
            was = committed[tp]
            if was is not None and was < target:
                target = was  # records after the commit were never applied: never skip them
            self._consumer.seek(tp, target)
            log.info(
                "replay since %s: %s[%d] from offset %s to %d",
                _iso(since_ms),
                tp.topic,
                tp.partition,
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


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _total(counter: Counter) -> float:
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))
