"""The gateway's delta stream consumer: Kafka deltas -> :class:`gateway.cache.RowCache` upserts/deletes.

:class:`DeltaStream` reads the updater's topics (embedgate binary/JSON deltas and HPS ``hps_et.<model>.<table>``
topics, decoded by ``schemas.deltas`` exactly as the updater decodes them) with an aiokafka consumer **without a
group**: it never commits and never joins the updater's group; partitions are all assigned to it, starting at the
end. Deltas the updater would dead-letter (undecodable, unknown model/table, wrong dim, NaN where forbidden) are
skipped here too (``embedgate_cache_deltas{outcome="invalid"}``). No message stops the consumer: the decoders raise
only DeltaError, and any other exception the decoding of one record raises is logged (WARNING, its class, where the
record is) and the record skipped the same way, instead of restarting the consumer.

Lag: after every fetch, when every assigned partition's position has reached its high watermark, the consumer is
"caught up" as of that fetch. ``lag_s`` = now - the last caught-up fetch. While ``lag_s > max_lag_s`` (or no partition
is assigned yet, or the broker does not answer, which stops fetches) every cache stops serving and is emptied; it
serves again once caught up. :meth:`DeltaStream.run` never raises for Kafka errors: it logs, reports through the
caches' ``reason`` and retries.

A topic that does not exist yet (``cache.topics`` defaults to each model's ``embedgate.deltas.<model>``, created by
the first publish or the updater) is picked up by the consumer's metadata refresh (``cache.metadata_max_age_ms``) and
read from the first record written since the consumer started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from gateway.cache import CacheMetrics, RowCache
from schemas.cache_settings import CacheSettings
from schemas.deltas import DeltaError, DeltaOp, check_against_manifest, decode_delta, decode_hps, delta_topic
from schemas.manifest import Manifest

__all__ = ["DeltaStream"]

log = logging.getLogger("embedgate.gateway.stream")
_FETCH_MS = 100


async def _rewind_new_partitions(consumer: Any, known: set[Any], started_ms: int) -> set[Any]:
    """Topic discovery: a partition assigned since the last fetch (a delta topic created after the consumer started,
    e.g. by the first publish) is read from the first record written since ``started_ms``, not from its end: the
    rows published before it was assigned reach the cache too. Returns the partitions now known."""
    assigned = set(consumer.assignment())
    new = assigned - known
    if new:
        found = await consumer.offsets_for_times(dict.fromkeys(new, started_ms))
        for tp in new:
            at = found.get(tp)
            if at is not None:
                consumer.seek(tp, at.offset)
    return assigned


class DeltaStream:
    """Feeds ``caches`` (manifest model name -> cache) from Kafka. Start :meth:`run` as a task; :meth:`stop` ends it."""

    def __init__(
        self,
        settings: CacheSettings,
        caches: Mapping[str, RowCache],
        manifests: Mapping[str, Manifest],
        metrics: CacheMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.caches = dict(caches)
        self.manifests = dict(manifests)
        self.metrics = metrics
        self._hps = re.compile(settings.hps_topic_pattern) if settings.hps_topic_pattern else None
        self.topics = (
            list(settings.topics)
            if settings.topics is not None
            else [delta_topic(m.model_name) for m in self.manifests.values()]
        )
        self._caught_up_at: float | None = (
            None  # wall-clock seconds of the last fetch that found nothing behind
        )
        self._stop = asyncio.Event()
        self.applied = 0  # delta messages applied (tests wait on it)
        self.progress = asyncio.Condition()
        for (
            name,
            cache,
        ) in self.caches.items():  # expiring tables (ttl_s): the cache drops what the PS expires
            manifest = self.manifests[name]
            ttl = {t.name: t.ttl_s for t in manifest.tables if t.ttl_s is not None}
            if ttl:
                cache.set_ttl(ttl, exported_at_ms=manifest.exported_at_ms, margin_s=settings.expiry_margin_s)

    @property
    def lag_s(self) -> float:
        if self._caught_up_at is None:
            return float("inf")
        return max(0.0, time.time() - self._caught_up_at)

    def stop(self) -> None:
        """Ask :meth:`run` to return after the fetch in flight (cancel the task to stop at once)."""
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self._consume()
            except Exception as exc:  # noqa: BLE001 - a broken stream only turns the cache off; retry
                log.warning("delta stream failed (%s: %s); cache off, retrying", type(exc).__name__, exc)
                self._set_serving(False, f"delta stream failed: {type(exc).__name__}: {exc}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0)

    async def _consume(self) -> None:
        from aiokafka import AIOKafkaConsumer

        s = self.settings
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            metadata_max_age_ms=s.metadata_max_age_ms,
            client_id="embedgate-gateway-cache",
        )
        try:
            await consumer.start()
            if s.hps_topic_pattern:
                parts = [re.escape(t) for t in self.topics] + [f"(?:{s.hps_topic_pattern})"]
                consumer.subscribe(pattern=f"^(?:{'|'.join(parts)})$")
            else:
                consumer.subscribe(topics=list(self.topics))
            started_ms, known = int(time.time() * 1000), set[Any]()
            while not self._stop.is_set():
                known = await _rewind_new_partitions(consumer, known, started_ms)
                batches = await consumer.getmany(timeout_ms=_FETCH_MS)
                for records in batches.values():
                    for rec in records:
                        self._apply(rec)
                for cache in self.caches.values():
                    cache.sweep()  # release expired rows even while no request reads them
                await self._check_lag(consumer)
                if batches:
                    async with self.progress:
                        self.progress.notify_all()
        finally:
            await consumer.stop()

    def _apply(self, rec: Any) -> None:
        """Apply one record to its model's cache, or skip it (invalid, another model's; never raises for a record's
        content)."""
        try:
            if self._hps is not None and self._hps.fullmatch(rec.topic):
                delta = decode_hps(
                    rec.topic, rec.value, key=rec.key, timestamp_ms=rec.timestamp, sequence=rec.offset
                )
                if delta is None:
                    return
            else:
                delta = decode_delta(rec.value)
            cache = self.caches.get(delta.model)
            if cache is None:
                self._count("other_model")
                return
            check_against_manifest(delta, self.manifests[delta.model])
        except DeltaError as exc:
            self._count("invalid")
            log.debug("delta at %s[%d]@%d skipped: %s", rec.topic, rec.partition, rec.offset, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a message must not stop the stream (module doc)
            self._count("invalid")
            log.warning(
                "delta at %s[%d]@%d skipped: decoding it raised %s",
                rec.topic,
                rec.partition,
                rec.offset,
                type(exc).__name__,
            )
            return
        if delta.op is DeltaOp.DELETE:
            cache.apply_delete(delta.table, delta.ids)
        else:
            assert delta.values is not None
            cache.apply_upsert(delta.table, delta.ids, delta.values, delta.timestamp_ms)
        self.applied += 1
        self._count("applied")

    async def _check_lag(self, consumer: Any) -> None:
        assigned = consumer.assignment()
        if not assigned:
            self._set_serving(False, "no delta topic partition assigned yet")
            return
        polled: list[int] = []
        for tp in assigned:
            high = consumer.highwater(tp)
            if high is None:
                break
            stamp = consumer.last_poll_timestamp(tp)
            if stamp is None or await consumer.position(tp) < high:
                break
            polled.append(stamp)
        else:
            self._caught_up_at = max(self._caught_up_at or 0.0, min(polled) / 1000.0)
        lag = self.lag_s
        if self.metrics is not None:
            self.metrics.stream_lag.set(lag if lag != float("inf") else -1)
        if lag <= self.settings.max_lag_s:
            self._set_serving(True)
        elif self._caught_up_at is None:
            self._set_serving(False, "delta stream not caught up yet")
        else:
            self._set_serving(
                False,
                f"delta stream lags {lag:.1f} s, more than cache.max_lag_s {self.settings.max_lag_s:g} s",
            )

    def status(self) -> dict[str, object]:
        """Per model: the cache's status (for /readyz)."""
        return {"models": {name: c.status() for name, c in self.caches.items()}}

    def check(self) -> None:
        """Turn caches off when the last caught-up fetch is too old (called by readers; fetches may be stuck)."""
        lag = self.lag_s
        if lag > self.settings.max_lag_s and any(c.serving for c in self.caches.values()):
            self._set_serving(
                False,
                f"delta stream lags {lag:.1f} s, more than cache.max_lag_s {self.settings.max_lag_s:g} s",
            )

    def _set_serving(self, serving: bool, reason: str = "") -> None:
        for cache in self.caches.values():
            if cache.serving != serving or (not serving and cache.reason != reason):
                if serving:
                    log.info("cache of %s serving", cache.model)
                elif cache.serving:
                    log.warning("cache of %s off: %s", cache.model, reason)
                cache.set_serving(serving, reason)

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.deltas.labels(outcome).inc()
