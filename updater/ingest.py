"""Decode, validate and route consumed records into per-shard groups. No I/O.

:class:`RecordDecoder` turns one Kafka record into an :class:`schemas.deltas.EmbeddingDelta`: binary/JSON deltas on
the delta topics, HPS records on ``hps_et.*`` topics (beacons decode to None and are skipped). It raises
:class:`schemas.deltas.DeltaError` (the loop dead-letters the record with its ``reason``) for a malformed message,
an ``unknown_model``, a table or dimension the manifest lacks, or an unversioned record outside the partition of its
shard (``wrong_partition``: shard ``s`` belongs in partition ``s % P``; elsewhere only a row version orders it against
the shard's other messages, so a versioned one is applied and counted as misplaced). :meth:`RecordDecoder.group` splits a batch of records into one
:class:`updater.batch.GroupBuffer` per (model, shard, table), rows in arrival order.

**A message never stops the stream.** The decoders raise only DeltaError (``schemas.deltas``); as a second line, any
other exception the pure work on one record raises (decoding, the manifest check, routing its rows to shards) is
turned into ``DeltaError(DECODER_ERROR)`` naming the exception's class, counted in
``embedgate_updater_poison_messages_total{error}``, and the record is dead-lettered like any invalid one. Exceptions
that are not ``Exception`` (cancellation, KeyboardInterrupt) pass. No backend is called here, so a retriable PS error
can never be mistaken for a bad message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.deltas import (
    DECODER_ERROR,
    DeltaError,
    EmbeddingDelta,
    check_against_manifest,
    decode_delta,
    decode_hps,
    shard_partition,
)
from schemas.deployment import EmbeddingModel
from schemas.manifest import Manifest
from schemas.partition import shard_for
from updater.apply import GroupKey
from updater.batch import GroupBuffer, split_by_shard
from updater.kafka_client import Record
from updater.metrics import UpdaterMetrics

__all__ = ["RecordDecoder", "Route"]

_HPS_RE = re.compile(r"^hps_et\.")


@dataclass(frozen=True)
class Route:
    """A configured model and its manifest."""

    config: EmbeddingModel
    manifest: Manifest


class RecordDecoder:
    """``routes`` by model name; ``partitions_for_topic`` gives a topic's partition numbers (None: no metadata,
    then the partition is not checked); ``metrics`` counts messages by kind (``delta``, ``hps``, ``beacon``)."""

    def __init__(
        self,
        routes: Mapping[str, Route],
        partitions_for_topic: Callable[[str], Collection[int] | None],
        metrics: UpdaterMetrics,
    ) -> None:
        self._routes = routes
        self._partitions_for_topic = partitions_for_topic
        self._metrics = metrics

    def decode(self, rec: Record, *, count: bool = True) -> EmbeddingDelta | None:
        """The delta in ``rec`` (None: an HPS beacon); DeltaError if invalid. ``count`` updates the metrics."""
        routed = self._decode(rec, count)
        return None if routed is None else routed[0]

    def _decode(self, rec: Record, count: bool) -> tuple[EmbeddingDelta, list[int]] | None:
        """The delta and the shards its rows belong to (ascending), or None for a beacon; DeltaError, and only that,
        for a bad record (any other exception of the pure work on it becomes ``DECODER_ERROR``, module doc)."""
        partitions = self._partitions_for_topic(rec.topic)  # not the message's doing: outside the guard
        try:
            return self._decode_unguarded(rec, partitions, count)
        except DeltaError as exc:
            if exc.reason == DECODER_ERROR and count:
                cause = exc.__cause__
                self._metrics.poison.labels(type(cause or exc).__name__).inc()
            raise
        except Exception as exc:  # one message must not stop the stream: it is dead-lettered
            if count:
                self._metrics.poison.labels(type(exc).__name__).inc()
            raise DeltaError(
                DECODER_ERROR, f"decoding this message failed: {type(exc).__name__}: {str(exc)[:200]}"
            ) from exc

    def _decode_unguarded(
        self, rec: Record, partitions: Collection[int] | None, count: bool
    ) -> tuple[EmbeddingDelta, list[int]] | None:
        if _HPS_RE.match(rec.topic):
            delta = decode_hps(
                rec.topic, rec.value, key=rec.key, timestamp_ms=rec.timestamp, sequence=rec.offset
            )
            if delta is None:
                if count:
                    self._metrics.messages.labels("beacon").inc()
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
        shards = _shards(delta, route.manifest.num_shards)
        self._check_partition(rec, partitions, delta, shards, count)
        if count:
            self._metrics.messages.labels(kind).inc()
        return delta, shards

    def group(self, records: list[Any]) -> tuple[list[GroupBuffer], list[tuple[Any, DeltaError]]]:
        """``(groups, invalid)``: the valid rows of ``records`` per group in arrival order, and each invalid record
        with its error."""
        groups: dict[GroupKey, GroupBuffer] = {}
        invalid: list[tuple[Any, DeltaError]] = []
        for rec in records:
            try:
                routed = self._decode(rec, True)
                if routed is None:
                    continue
                delta, shards = routed
                manifest = self._routes[delta.model].manifest
                parts = self._parts(rec, delta, shards, manifest)
            except DeltaError as exc:
                invalid.append((rec, exc))
                continue
            for shard, ids, values in parts:
                key = GroupKey(delta.model, shard, delta.table)
                buf = groups.get(key)
                if buf is None:
                    buf = groups[key] = GroupBuffer(key=key, dim=manifest.table(delta.table).dim)
                buf.add(ids, values, delta.timestamp_ms, rec, delta.sequence)
        return list(groups.values()), invalid

    def _parts(
        self, rec: Record, delta: EmbeddingDelta, shards: list[int], manifest: Manifest
    ) -> list[tuple[int, Any, Any]]:
        """``delta``'s rows per shard: ``(shard, ids, values)``; DeltaError(DECODER_ERROR) if splitting fails."""
        if len(shards) == 1:  # the common case: a producer sends one shard's rows per message
            return [(shards[0], delta.ids, delta.values)]
        try:
            return list(split_by_shard(delta, manifest.num_shards))
        except Exception as exc:  # as in _decode: one message must not stop the stream
            self._metrics.poison.labels(type(exc).__name__).inc()
            raise DeltaError(
                DECODER_ERROR, f"routing this message's rows failed: {type(exc).__name__}: {str(exc)[:200]}"
            ) from exc

    def _check_partition(
        self,
        rec: Record,
        partitions: Collection[int] | None,
        delta: EmbeddingDelta,
        shards: list[int],
        count: bool,
    ) -> None:
        """A record outside the partition of its shard (``s % P``), as a producer that hashes or scatters its keys
        writes it, is applied when its rows are versioned (``timestamp_ms`` > 0): newest-wins per row makes the
        order of two partitions irrelevant, and the replica records its position on that partition too (counted in
        ``embedgate_updater_misplaced_messages_total``). An unversioned one (``timestamp_ms`` 0) is ordered only by
        its partition's log, so it could overtake, or be overtaken by, the shard's other messages: ``wrong_partition``.
        """
        if not partitions:
            return  # no metadata (cannot happen for an assigned partition): nothing to check against
        n_partitions = len(partitions)
        wrong = [sh for sh in shards if shard_partition(sh, n_partitions) != rec.partition]
        if not wrong:
            return
        if delta.timestamp_ms > 0:
            if count:
                self._metrics.misplaced.labels(delta.model).inc()
            return
        raise DeltaError(
            "wrong_partition",
            f"rows of {delta.model} shard {wrong[0]} belong in partition "
            f"{shard_partition(wrong[0], n_partitions)} of {n_partitions} ({rec.topic}), found in partition {rec.partition}, "
            "without a timestamp_ms to order them by; producers must send shard s to partition s % partitions "
            "or version their rows",
        )


def _shards(delta: EmbeddingDelta, num_shards: int) -> list[int]:
    """The shards ``delta``'s rows belong to, ascending (one hash pass; no sort when all rows share a shard)."""
    if num_shards == 1:
        return [0]
    shards = shard_for(delta.ids, num_shards)
    first = int(shards[0])
    if bool((shards == first).all()):
        return [first]
    return [int(s) for s in np.unique(shards)]
