"""Trainer-side publisher of absolute embedding rows (:class:`DeltaPublisher`) and row sources for ``publish``.

Rows are split by PS shard (:func:`schemas.partition.shard_for` with the manifest's shard count); every message for
shard ``s`` goes explicitly to partition ``s % P`` (:func:`schemas.deltas.shard_partition`, P = the topic's partition
count), so shards spread evenly over partitions and one shard's messages stay, in order, in one partition; the key
``b"<model>/<shard>"`` is kept for tools. The topic defaults to the model's own (``embedgate.deltas.<model>``,
:func:`schemas.deltas.delta_topic`); a missing topic is created with ``max(topic_partitions, shards)`` partitions
before the first send. Large batches are chunked into messages of at most ``max_rows_per_message`` rows (and about
``max_message_bytes``). The aiokafka producer is idempotent (``enable_idempotence=True``, ``acks="all"``) and
batches with ``linger_ms``. ``sequence`` counts messages per shard for this publisher. Use as
``async with DeltaPublisher(...) as pub: await pub.publish(...)``; Kafka problems raise aiokafka's ``KafkaError``.
``security`` (:class:`schemas.tls.KafkaSecurity`) connects over SSL, SASL_PLAINTEXT or SASL_SSL (PLAIN or SCRAM).

A table behind a Keras ``StringLookup`` / ``IntegerLookup`` / ``Hashing`` layer is keyed by what the gateway maps a
raw value to (:mod:`gateway.lookup_mapping`), not by the Embedding's row index: :func:`table_mappings` finds those
tables from ``lookups.json``, and :func:`model_keys` turns the model's own raw values (``"cat_01"``) into the PS keys
the gateway reads, refusing a value that the gateway would send to the OOV row. The synchronous
:class:`embedgate.train.RowPublisher` runs this same :class:`DeltaPublisher` on a thread of its own.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaProducer

from gateway.lookup_mapping import LookupKind, LookupMapping, LookupMappingError
from schemas.deltas import (
    DeltaOp,
    EmbeddingDelta,
    delta_topic,
    encode_delta,
    encode_delta_json,
    encode_hps,
    hps_topic,
    shard_partition,
)
from schemas.manifest import Manifest, TableSpec
from schemas.partition import shard_for
from schemas.tls import KafkaSecurity
from updater.kafka_security import client_kwargs

__all__ = [
    "DeltaPublisher",
    "KeyedTableError",
    "PublishResult",
    "load_rows",
    "message_key",
    "model_keys",
    "table_mappings",
]

Encoding = Literal["binary", "json"]


def message_key(model: str, shard: int) -> bytes:
    """The Kafka key of every message for ``shard`` of ``model``: keeps the shard's messages in one partition."""
    return f"{model}/{shard}".encode()


class PublishResult:
    """What :meth:`DeltaPublisher.publish` sent: messages and rows per shard."""

    def __init__(self, topic: str = "") -> None:
        self.topic = topic
        self.messages = 0
        self.rows_per_shard: dict[int, int] = {}

    @property
    def rows(self) -> int:
        return sum(self.rows_per_shard.values())

    def __repr__(self) -> str:
        return f"PublishResult(topic={self.topic!r}, messages={self.messages}, rows_per_shard={self.rows_per_shard})"


class DeltaPublisher:
    """Publishes deltas for models described by manifests. One instance per producer process; task-safe.
    ``security`` files (CA, client certificate, password file) are read here (``TLSFileError`` names a bad one)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic: str | None = None,
        producer_id: str | None = None,
        topic_partitions: int = 4,
        topic_replication_factor: int = 1,
        linger_ms: int = 10,
        max_rows_per_message: int = 4096,
        max_message_bytes: int = 900_000,
        encoding: Encoding = "binary",
        security: KafkaSecurity | None = None,
    ) -> None:
        self.topic = topic
        self._bootstrap = bootstrap_servers
        self._topic_partitions = topic_partitions
        self._replication_factor = topic_replication_factor
        self._partitions: dict[str, int] = {}
        self.producer_id = producer_id or f"publisher-{uuid.uuid4().hex[:8]}"
        self._max_rows = max_rows_per_message
        self._max_bytes = max_message_bytes
        self._encode = encode_delta_json if encoding == "json" else encode_delta
        self._sequence: dict[tuple[str, int], int] = {}
        self._security = client_kwargs(security)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
            client_id=self.producer_id,
            **self._security,
            enable_idempotence=True,
            acks="all",
            linger_ms=linger_ms,
            max_batch_size=1024 * 1024,
            max_request_size=8 * 1024 * 1024,
        )

    async def start(self) -> None:
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()  # release the client (no "Unclosed AIOKafkaProducer" warning)
            raise

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def partitions(self, topic: str, num_shards: int = 1) -> int:
        """Partition count of ``topic``; creates it first when missing, with ``max(topic_partitions, num_shards)``
        partitions (so each shard of the model gets its own partition). Cached per topic."""
        known = self._partitions.get(topic)
        if known is not None:
            return known
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._bootstrap, client_id=f"{self.producer_id}-admin", **self._security
        )
        await admin.start()
        try:
            if topic not in set(await admin.list_topics()):
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(
                        [
                            NewTopic(
                                topic,
                                num_partitions=max(self._topic_partitions, num_shards),
                                replication_factor=self._replication_factor,
                            )
                        ]
                    )
        finally:
            await admin.close()
        count = len(await self._producer.partitions_for(topic))
        self._partitions[topic] = count
        return count

    def _next_sequence(self, model: str, shard: int) -> int:
        seq = self._sequence.get((model, shard), 0)
        self._sequence[(model, shard)] = seq + 1
        return seq

    async def publish(
        self,
        manifest: Manifest,
        table: str,
        ids: npt.ArrayLike,
        values: npt.ArrayLike | None = None,
        *,
        delete: bool = False,
        timestamp_ms: int | None = None,
    ) -> PublishResult:
        """Publish absolute rows (``values`` float32 [n, dim]) or deletes of ``ids`` to the publisher's topic (default:
        the model's, ``embedgate.deltas.<model>``); returns once the broker acknowledged every message. Validates
        table and dim against ``manifest`` first (ValueError)."""
        spec = _table(manifest, table)
        id_arr = np.atleast_1d(np.asarray(ids, dtype=np.int64))
        val_arr: npt.NDArray[np.float32] | None = None
        if delete:
            if values is not None:
                raise ValueError("a delete takes no values")
        else:
            if values is None:
                raise ValueError("an upsert needs values")
            val_arr = np.asarray(values, dtype=np.float32).reshape(len(id_arr), -1)
            if val_arr.shape[1] != spec.dim:
                raise ValueError(
                    f"table {table!r} has dim {spec.dim}, the values have {val_arr.shape[1]} columns"
                )
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        topic = self.topic or delta_topic(manifest.model_name)
        partitions = await self.partitions(topic, manifest.num_shards)
        row_bytes = 8 + 4 * (0 if val_arr is None else spec.dim)
        chunk = max(1, min(self._max_rows, self._max_bytes // row_bytes))
        shards = shard_for(id_arr, manifest.num_shards)
        result = PublishResult(topic)
        futures = []
        for s in np.unique(shards):
            mask = shards == s
            s_ids = id_arr[mask]
            s_vals = None if val_arr is None else val_arr[mask]
            shard = int(s)
            for start in range(0, len(s_ids), chunk):
                delta = EmbeddingDelta(
                    model=manifest.model_name,
                    table=table,
                    op=DeltaOp.DELETE if delete else DeltaOp.UPSERT,
                    ids=s_ids[start : start + chunk],
                    values=None if s_vals is None else s_vals[start : start + chunk],
                    timestamp_ms=ts,
                    sequence=self._next_sequence(manifest.model_name, shard),
                    producer=self.producer_id,
                )
                futures.append(
                    await self._producer.send(
                        topic,
                        value=self._encode(delta),
                        key=message_key(delta.model, shard),
                        partition=shard_partition(shard, partitions),
                    )
                )
                result.messages += 1
            result.rows_per_shard[shard] = result.rows_per_shard.get(shard, 0) + len(s_ids)
        for fut in futures:
            await fut
        return result

    async def publish_hps(
        self, manifest: Manifest, table: str, ids: npt.ArrayLike, values: npt.ArrayLike
    ) -> PublishResult:
        """Publish rows in HugeCTR HPS's Kafka format to ``hps_et.<model>.<table>``, as an HPS trainer would: no
        key; every message holds one shard's rows and goes to partition ``shard % partitions`` so each key keeps
        its order (a missing topic is created as in :meth:`partitions`). Upserts only (HPS has no delete)."""
        spec = _table(manifest, table)
        id_arr = np.atleast_1d(np.asarray(ids, dtype=np.int64))
        val_arr = np.asarray(values, dtype=np.float32).reshape(len(id_arr), -1)
        if val_arr.shape[1] != spec.dim:
            raise ValueError(
                f"table {table!r} has dim {spec.dim}, the values have {val_arr.shape[1]} columns"
            )
        topic = hps_topic(manifest.model_name, table)
        partitions = await self.partitions(topic, manifest.num_shards)
        chunk = max(1, min(self._max_rows, self._max_bytes // (8 + 4 * spec.dim)))
        shards = shard_for(id_arr, manifest.num_shards)
        result = PublishResult(topic)
        futures = []
        for s in np.unique(shards):
            mask = shards == s
            s_ids, s_vals = id_arr[mask], val_arr[mask]
            partition = shard_partition(int(s), partitions)
            for start in range(0, len(s_ids), chunk):
                payload = encode_hps(s_ids[start : start + chunk], s_vals[start : start + chunk])
                futures.append(await self._producer.send(topic, value=payload, key=None, partition=partition))
                result.messages += 1
            result.rows_per_shard[int(s)] = len(s_ids)
        for fut in futures:
            await fut
        return result

    async def send_raw(self, topic: str, value: bytes | None, key: bytes | None = None) -> None:
        """Send pre-encoded bytes (tests, tools); returns once acknowledged."""
        await self._producer.send_and_wait(topic, value=value, key=key)


class KeyedTableError(ValueError):
    """Rows addressed the wrong way for a table behind a lookup layer (a raw id, or a value outside the
    vocabulary); the message names the table, the layer and what to do instead."""


def table_mappings(manifest: Manifest, lookups: Mapping[str, LookupMapping]) -> dict[str, LookupMapping]:
    """Table -> the lookup mapping in front of it (``lookups``: feature -> mapping, :func:`gateway.lookup_mapping.
    load_lookups`). A table read by no feature with a mapping is keyed by its ids as they are and is absent."""
    out: dict[str, LookupMapping] = {}
    for f in manifest.sparse_features:
        mapping = lookups.get(f.name)
        if mapping is not None:
            out.setdefault(f.table, mapping)
    return out


def model_keys(table: str, mapping: LookupMapping, values: Sequence[Any]) -> npt.NDArray[np.int64]:
    """The PS keys of the model's own raw ``values`` (strings for a ``StringLookup`` or a string ``Hashing``,
    integers otherwise) of ``table`` behind ``mapping``, computed exactly as the gateway does for a request.

    A ``StringLookup`` / ``IntegerLookup`` value outside the exported vocabulary raises :class:`KeyedTableError`: the
    gateway serves it the OOV row, so a row published under its key would never be read. A ``Hashing`` value maps to
    its bin (several values may share one)."""
    try:
        raw = mapping.raw_keys(list(values))
    except LookupMappingError as exc:
        raise KeyedTableError(f"table {table!r} (behind layer {mapping.layer!r}): {exc}") from None
    keys = mapping.map_keys(raw)
    if mapping.kind is not LookupKind.HASHING:
        outside = np.flatnonzero(keys != raw)
        if outside.size:
            i = int(outside[0])
            raise KeyedTableError(
                f"table {table!r}: value {values[i]!r} (value {i}) is not in the vocabulary of lookup layer "
                f"{mapping.layer!r}: the gateway serves it the OOV row, so a row published for it would never be read"
            )
    return keys


def _table(manifest: Manifest, table: str) -> TableSpec:
    try:
        return manifest.table(table)
    except KeyError:
        known = ", ".join(t.name for t in manifest.tables)
        raise ValueError(f"model {manifest.model_name!r} has no table {table!r} (tables: {known})") from None


def load_rows(path: Path, dim: int | None = None) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Rows from an HPS table directory (``key`` int64 LE + ``emb_vector`` float32 LE files), a ``.npz`` with
    ``ids``/``values`` (or ``keys``/``emb_vector``) arrays, or a ``.npy`` of values (ids 0..n-1 then; pass ids
    separately instead when they differ). ``dim`` is needed to shape raw HPS vectors; errors name the file."""
    if path.is_dir():
        key_file, vec_file = path / "key", path / "emb_vector"
        if not key_file.is_file() or not vec_file.is_file():
            raise ValueError(f"{path}: an HPS table directory needs files 'key' and 'emb_vector'")
        ids = np.fromfile(key_file, dtype="<i8")
        vecs = np.fromfile(vec_file, dtype="<f4")
        if dim is None:
            if len(ids) == 0 or vecs.size % len(ids):
                raise ValueError(f"{path}: {vecs.size} floats do not split into {len(ids)} rows")
            dim = vecs.size // len(ids)
        if vecs.size != len(ids) * dim:
            raise ValueError(f"{vec_file}: {vecs.size} floats, expected {len(ids)} keys x dim {dim}")
        return ids, vecs.reshape(len(ids), dim)
    if path.suffix == ".npz":
        with np.load(path) as data:
            names = set(data.files)
            for id_name, val_name in (("ids", "values"), ("keys", "emb_vector"), ("key", "emb_vector")):
                if id_name in names and val_name in names:
                    ids = np.asarray(data[id_name], dtype=np.int64).reshape(-1)
                    vals = np.asarray(data[val_name], dtype=np.float32)
                    return ids, vals.reshape(len(ids), -1)
        raise ValueError(
            f"{path}: expected arrays 'ids' and 'values' (or 'keys' and 'emb_vector'), got {sorted(names)}"
        )
    if path.suffix == ".npy":
        vals = np.asarray(np.load(path), dtype=np.float32)
        if vals.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D [n, dim] array, got shape {vals.shape}")
        return np.arange(len(vals), dtype=np.int64), vals
    raise ValueError(f"{path}: not an HPS table directory, .npz or .npy file")
