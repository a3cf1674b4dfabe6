"""The updater process: assemble the consumer loop from real clients, run it, leave the group.

:class:`Updater` reads the models' manifests (:func:`load_models`), creates the topics if asked, and composes an
aiokafka consumer group member (``enable_auto_commit=False``), a dead-letter producer (idempotent, ``acks="all"``),
a :class:`updater.apply.ShardWriter` and :class:`updater.metrics.UpdaterMetrics` into one
:class:`updater.loop.ConsumerLoop`, whose docstring describes an iteration and the at-least-once rule: offsets are
committed only for records whose rows every replica acknowledged, or that were dead-lettered. Because rows are
absolute and versioned and each shard's messages share one partition, replaying from the committed offset converges
to the newest published value per key. :meth:`Updater.stop` (SIGTERM) lets the writes in flight finish, commits and
leaves the group. A rebalance drops everything uncommitted; the new owner replays it.

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
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from schemas.deployment import EmbeddingModel
from schemas.manifest import Manifest, ManifestError
from schemas.updater_settings import UpdaterSettings, parse_replay_since
from updater.apply import ShardWriter
from updater.catchup import CatchUpTasks
from updater.deadletter import DeadLetterer
from updater.errors import ConfigError
from updater.expiry import Expirer
from updater.ingest import RecordDecoder, Route
from updater.kafka_security import client_kwargs
from updater.loop import ConsumerLoop, iso_ms
from updater.membership import check_group
from updater.metrics import UpdaterMetrics
from updater.resume import seed_committed_offsets
from updater.scheduler import ApplyScheduler

__all__ = ["Updater", "load_models", "replay_timestamp_ms"]

log = logging.getLogger("embedgate.updater")

_PENDING_CALLS = 4  # rows waiting behind writes in flight, in units of batch.max_rows_per_call


def load_models(models: Sequence[EmbeddingModel]) -> dict[str, Route]:
    """Read each model's manifest and check its shard list matches the manifest's partition; ConfigError if not."""
    routes: dict[str, Route] = {}
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
        routes[m.name] = Route(m, manifest)
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
    def __init__(self, loop: ConsumerLoop) -> None:
        self._loop = loop

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._loop.on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._loop.on_assigned(list(assigned))


class Updater:
    """One updater process. Call :meth:`run` once (it owns start and stop of every client); :meth:`stop` may be
    called from a signal handler in the same loop. Not reusable after run returns."""

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
        self._expirer = Expirer(
            self._routes,
            registry=self.metrics.registry,
            deadline_s=max(30.0, settings.apply_deadline_s),
            tls=settings.backend_tls,
        )
        self._kafka_security = client_kwargs(settings.kafka_security())  # reads the password file now
        self._stop = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._replay_ms: int | None = None  # replay_since, until the first assignment was sought there
        if settings.replay_since is not None:
            self._replay_ms = replay_timestamp_ms(settings.replay_since, settings.embedding_models)
            log.info(
                "replay since %s (%s) on the first assignment", iso_ms(self._replay_ms), settings.replay_since
            )
        self.ready = asyncio.Event()

    # -- life cycle -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`run` to finish the writes in flight, commit and leave the group."""
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
        dlq = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap_servers,
            client_id=f"{s.client_id}-dlq",
            **self._kafka_security,
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
        )
        consumer = AIOKafkaConsumer(
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
        self._consumer = consumer
        loop = self._compose(consumer, dlq)
        expiry = None
        if self._expirer.active and s.expire_interval_s > 0:  # ttl_s tables: expire on a schedule
            expiry = asyncio.create_task(self._expirer.run(s.expire_interval_s, self._stop))
        try:
            await dlq.start()
            try:
                await consumer.start()
                listener = _Listener(loop)
                if s.hps_pattern:
                    parts = [re.escape(t) for t in s.delta_topics] + [f"(?:{s.hps_pattern})"]
                    consumer.subscribe(pattern=f"^(?:{'|'.join(parts)})$", listener=listener)
                else:
                    consumer.subscribe(topics=s.delta_topics, listener=listener)
                self.ready.set()
                await loop.run()
            finally:
                await consumer.stop()  # leaves the group
        finally:
            if expiry is not None:
                expiry.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await expiry
            await self._expirer.close()
            await dlq.stop()
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

    def _compose(self, consumer: AIOKafkaConsumer, dlq: AIOKafkaProducer) -> ConsumerLoop:
        s = self.settings
        decoder = RecordDecoder(self._routes, consumer.partitions_for_topic, self.metrics)
        catch_ups = CatchUpTasks(
            manifests={name: r.manifest for name, r in self._routes.items()},
            writer=self._writer,
            decode=functools.partial(decoder.decode, count=False),
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
            metrics=self.metrics,
        )
        return ConsumerLoop(
            client=consumer,
            decoder=decoder,
            scheduler=ApplyScheduler(
                s.retry, max_pending_rows=_PENDING_CALLS * s.batch.max_rows_per_call, clock=time.monotonic
            ),
            writer=self._writer,
            dead_letters=DeadLetterer(dlq, s.dead_letter_topic, self.metrics, s.retry, clock=time.monotonic),
            catch_ups=catch_ups,
            metrics=self.metrics,
            batch=s.batch,
            stop=self._stop,
            clock=time.monotonic,
            replay_ms=self._replay_ms,
        )

    async def _ensure_topics(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        s = self.settings
        admin = AIOKafkaAdminClient(
            bootstrap_servers=s.bootstrap_servers, client_id=f"{s.client_id}-admin", **self._kafka_security
        )
        try:
            await admin.start()
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
