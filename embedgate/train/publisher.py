"""``RowPublisher``: the synchronous, thread-backed publisher of embedding rows for any training loop.

A trainer calls :meth:`RowPublisher.publish` / :meth:`RowPublisher.delete` from its own (synchronous) code; the rows
are copied into a bounded buffer and sent by a background thread that runs :class:`updater.producer.DeltaPublisher`
on its own asyncio event loop, so the wire format, the shard split, the partitioning and the topic are exactly the
asyncio publisher's (one code path). Calls are sent in the order they were made: the timestamp of a row is taken when
``publish`` is called, and the background thread sends one call at a time.

Memory is bounded: when the rows waiting to be acknowledged would exceed ``max_pending_bytes``, ``publish`` blocks
the trainer until enough are acknowledged (a single call larger than the bound waits for an empty buffer and then
goes alone). Rows are never dropped: :attr:`PublisherStats.blocked_s` counts how long the trainer was blocked.

Kafka failures: a retriable error (broker down, leader moved, request timed out) is retried by the background
thread with a backoff for up to ``retry_s`` seconds, re-sending the whole call (rows are absolute and versioned, so a
row sent twice is harmless) while later calls wait behind it; the trainer blocks only once the buffer is full. A
failure that is not retriable, or that lasts longer than ``retry_s``, moves the publisher to ``FAILED``: the next
``publish``, ``delete``, ``flush`` or ``close`` raises one :class:`PublishError` naming the table, the rows not known
to be published and the cause; nothing queued after it is sent.

Thread safety: the methods may be called from several threads; calls from one thread are sent in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from embedgate.train.metrics import TrainerMetrics
from gateway.lookup_mapping import LookupMapping, load_lookups
from schemas.deltas import delta_topic
from schemas.manifest import Manifest, TableSpec
from schemas.tls import KafkaSecurity
from updater.producer import DeltaPublisher, PublishResult, model_keys, table_mappings

__all__ = ["PublishError", "PublisherState", "PublisherStats", "RowPublisher"]

log = logging.getLogger("embedgate.train")

_RETRY_BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0)


class PublishError(RuntimeError):
    """Rows could not be published; the message names the table, how many rows are not known to be published and
    why. Raised once per failure by the next call, then by every later call (the publisher stays ``FAILED``)."""


class PublisherState(StrEnum):
    RUNNING = "running"
    FAILED = "failed"  # a send failed for good: every call raises the PublishError
    CLOSED = "closed"


@dataclass(frozen=True)
class PublisherStats:
    """Counters since the publisher started. ``pending_*``: copied into the buffer, not yet acknowledged."""

    rows: int  # rows (or deletes) acknowledged by the broker
    messages: int  # Kafka messages acknowledged
    bytes: int  # row payload bytes acknowledged (8 per id + 4 per float)
    calls: int  # publish/delete calls acknowledged
    retries: int  # sends retried after a retriable Kafka error
    blocked_s: float  # total time publish/delete blocked the caller because the buffer was full
    pending_rows: int
    pending_bytes: int
    last_ack_lag_s: float  # call -> acknowledgement of the last acknowledged call


@dataclass
class _Work:
    table: str
    ids: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32] | None
    timestamp_ms: int
    nbytes: int
    submitted: float


class RowPublisher:
    """Publishes rows of the model described by ``manifest`` (a model directory holding ``manifest.json`` and, for
    tables behind lookup layers, ``lookups.json``; or a :class:`~schemas.manifest.Manifest`, then ``lookups`` gives
    the mappings) to Kafka at ``bootstrap``.

    ``ids`` of :meth:`publish` / :meth:`delete` are the model's own keys: the Embedding row index for a plain table,
    the raw value (a string for ``StringLookup``, an integer for ``IntegerLookup``, either for ``Hashing``) for a
    table behind a lookup layer, mapped to the PS key exactly as the gateway maps a request
    (:func:`updater.producer.model_keys`). :meth:`publish_keys` takes PS keys as exported, for any table.

    The other arguments are :class:`~updater.producer.DeltaPublisher`'s, plus ``max_pending_bytes`` (the buffer
    bound), ``retry_s`` (how long a retriable Kafka error is retried) and ``start_timeout_s`` (how long the
    constructor waits for the producer to connect; ``PublishError`` after it).
    """

    def __init__(
        self,
        manifest: str | Path | Manifest,
        bootstrap: str,
        *,
        lookups: dict[str, LookupMapping] | None = None,
        topic: str | None = None,
        producer_id: str | None = None,
        max_pending_bytes: int = 64 * 1024 * 1024,
        retry_s: float = 120.0,
        start_timeout_s: float = 60.0,
        linger_ms: int = 10,
        security: KafkaSecurity | None = None,
        metrics: TrainerMetrics | None = None,
    ) -> None:
        if isinstance(manifest, Manifest):
            self.manifest = manifest
            mappings = lookups or {}
        else:
            self.manifest = Manifest.load(manifest)
            model_dir = Path(manifest) if Path(manifest).is_dir() else Path(manifest).parent
            mappings = load_lookups(model_dir) if lookups is None else lookups
        self.mappings: dict[str, LookupMapping] = table_mappings(self.manifest, mappings)
        if max_pending_bytes < 1:
            raise ValueError(f"max_pending_bytes must be >= 1, got {max_pending_bytes}")
        self.metrics = metrics
        self._max_bytes = max_pending_bytes
        self._retry_s = retry_s
        self._cond = threading.Condition()
        self._state = PublisherState.RUNNING
        self._error: PublishError | None = None
        self._pending_bytes = 0
        self._pending_rows = 0
        self._pending_calls = 0
        self._stats = {"rows": 0, "messages": 0, "bytes": 0, "calls": 0, "retries": 0}
        self._blocked_s = 0.0
        self._last_lag_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="embedgate-row-publisher", daemon=True
        )
        self._thread.start()
        self.producer_id = producer_id or f"trainer-{uuid.uuid4().hex[:8]}"
        self._pub_kwargs: dict[str, Any] = {
            "topic": topic,
            "producer_id": self.producer_id,
            "linger_ms": linger_ms,
            "security": security,
        }
        self._bootstrap = bootstrap
        self.bootstrap = bootstrap
        self.security = security
        self.topic = topic or delta_topic(self.manifest.model_name)
        self._pub: DeltaPublisher | None = None
        self._lock: asyncio.Lock | None = None
        self._send_failed = False  # loop thread only
        self._closed = False
        try:
            self._call(self._start(), start_timeout_s)
        except BaseException as exc:
            self._shutdown()
            raise PublishError(f"cannot start publishing to Kafka at {bootstrap}: {_describe(exc)}") from exc

    # -- public API -----------------------------------------------------------------------------------------------
    @property
    def state(self) -> PublisherState:
        return self._state

    def publish(self, table: str, ids: Sequence[Any] | npt.ArrayLike, values: npt.ArrayLike) -> None:
        """Queue absolute rows ``values`` (float32-convertible ``[n, dim]``) of ``table`` for the model's keys
        ``ids``; returns once they are copied (blocks while the buffer is full). ValueError / KeyedTableError for a
        bad table, shape or key, before anything is queued; :class:`PublishError` after a failure."""
        self._submit(table, self._keys(table, ids), values)

    def delete(self, table: str, ids: Sequence[Any] | npt.ArrayLike) -> None:
        """Queue deletes of the model's keys ``ids`` of ``table`` (as :meth:`publish`)."""
        self._submit(table, self._keys(table, ids), None)

    def publish_keys(
        self, table: str, keys: npt.ArrayLike, values: npt.ArrayLike | None, *, delete: bool = False
    ) -> None:
        """Queue rows (or, ``delete``, deletes) under PS keys as exported (``lookups.json`` keys, ``OOV_KEY``),
        without mapping: what :class:`~embedgate.train.StreamRows` sends."""
        key_arr = np.atleast_1d(np.asarray(keys, dtype=np.int64)).copy()
        self._submit(table, key_arr, None if delete else values)

    def flush(self, timeout: float | None = None) -> None:
        """Block until every queued call is acknowledged by the broker; :class:`PublishError` if one failed,
        ``TimeoutError`` after ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending_calls and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"flush: {self._pending_rows} rows in {self._pending_calls} calls not acknowledged after "
                        f"{timeout:g} s"
                    )
                self._cond.wait(left)
            self._raise_failed()

    def close(self, timeout: float | None = 60.0) -> None:
        """Flush (up to ``timeout``), then stop the producer and its thread. Idempotent; raises what flush raises,
        after stopping."""
        if self._closed:
            self._raise_failed()
            return
        try:
            if self._state is PublisherState.RUNNING:
                self.flush(timeout)
            else:
                self._raise_failed()
        finally:
            self._shutdown()

    def stats(self) -> PublisherStats:
        with self._cond:
            return PublisherStats(
                **self._stats,
                blocked_s=self._blocked_s,
                pending_rows=self._pending_rows,
                pending_bytes=self._pending_bytes,
                last_ack_lag_s=self._last_lag_s,
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
        else:
            try:
                self.close()
            except PublishError:
                log.exception("publisher closed after an error in the training loop")

    # -- internals ------------------------------------------------------------------------------------------------
    def _keys(self, table: str, ids: Sequence[Any] | npt.ArrayLike) -> npt.NDArray[np.int64]:
        mapping = self.mappings.get(table)
        if mapping is None:
            return np.atleast_1d(np.asarray(ids, dtype=np.int64)).copy()
        raw = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)  # type: ignore[arg-type]
        return model_keys(table, mapping, raw)

    def _submit(self, table: str, ids: npt.NDArray[np.int64], values: npt.ArrayLike | None) -> None:
        spec = self._spec(table)
        vals: npt.NDArray[np.float32] | None = None
        if values is not None:
            vals = (
                np.array(values, dtype=np.float32, copy=True).reshape(len(ids), -1)
                if len(ids)
                else np.zeros((0, spec.dim), np.float32)
            )
            if vals.shape[1] != spec.dim:
                raise ValueError(
                    f"table {table!r} has dim {spec.dim}, the values have {vals.shape[1]} columns"
                )
        if not len(ids):
            self._raise_failed()
            return
        nbytes = ids.nbytes + (0 if vals is None else vals.nbytes)
        work = _Work(table, ids, vals, int(time.time() * 1000), nbytes, time.monotonic())
        self._reserve(work)
        fut = asyncio.run_coroutine_threadsafe(self._send(work), self._loop)
        fut.add_done_callback(lambda f: self._done(work, f))

    def _spec(self, table: str) -> TableSpec:
        try:
            return self.manifest.table(table)
        except KeyError:
            known = ", ".join(t.name for t in self.manifest.tables)
            raise ValueError(
                f"model {self.manifest.model_name!r} has no table {table!r} (tables: {known})"
            ) from None

    def _reserve(self, work: _Work) -> None:
        with self._cond:
            self._raise_failed()
            if self._closed:
                raise PublishError("the publisher is closed")
            if self._pending_calls and self._pending_bytes + work.nbytes > self._max_bytes:
                start = time.monotonic()
                while (
                    self._pending_calls
                    and self._pending_bytes + work.nbytes > self._max_bytes
                    and self._error is None
                ):
                    self._cond.wait()
                waited = time.monotonic() - start
                self._blocked_s += waited
                if self.metrics is not None:
                    self.metrics.blocked.inc(waited)
                self._raise_failed()
            self._pending_bytes += work.nbytes
            self._pending_rows += len(work.ids)
            self._pending_calls += 1
            if self.metrics is not None:
                self.metrics.pending.set(self._pending_rows)

    def _done(self, work: _Work, fut: Future[PublishResult]) -> None:
        with self._cond:
            self._pending_bytes -= work.nbytes
            self._pending_rows -= len(work.ids)
            self._pending_calls -= 1
            exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            if exc is None:
                res = fut.result()
                self._stats["rows"] += res.rows
                self._stats["messages"] += res.messages
                self._stats["bytes"] += work.nbytes
                self._stats["calls"] += 1
                self._last_lag_s = time.monotonic() - work.submitted
                if self.metrics is not None:
                    self.metrics.rows.labels(work.table).inc(res.rows)
                    self.metrics.bytes.labels(work.table).inc(work.nbytes)
                    self.metrics.messages.inc(res.messages)
                    self.metrics.lag.observe(self._last_lag_s)
            elif self._error is None:
                if self.metrics is not None:
                    self.metrics.failures.inc()
                self._state = PublisherState.FAILED
                self._error = PublishError(
                    f"publishing {len(work.ids)} {'rows' if work.values is not None else 'deletes'} of table "
                    f"{work.table!r} failed: {_describe(exc)}; they and every later call are not known to be "
                    "published"
                )
                self._error.__cause__ = exc
            if self.metrics is not None:
                self.metrics.pending.set(self._pending_rows)
            self._cond.notify_all()

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _call(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        self._lock = asyncio.Lock()

        async def connect() -> None:
            pub = DeltaPublisher(self._bootstrap, **self._pub_kwargs)  # built on the loop that runs it
            await pub.start()  # a failed start releases the client itself
            self._pub = pub

        await self._retrying(connect, "connect")

    async def _send(self, work: _Work) -> PublishResult:
        assert self._lock is not None
        async with self._lock:  # FIFO: calls are sent in the order they were made
            if self._send_failed:
                raise RuntimeError("not sent: an earlier call failed")

            pub = self._pub
            assert pub is not None

            async def once() -> PublishResult:
                return await pub.publish(
                    self.manifest,
                    work.table,
                    work.ids,
                    work.values,
                    delete=work.values is None,
                    timestamp_ms=work.timestamp_ms,
                )

            try:
                result: PublishResult = await self._retrying(once, f"table {work.table!r}")
            except BaseException:
                self._send_failed = True  # set before the lock is released: no later call is sent
                raise
            return result

    async def _retrying(self, op: Any, what: str) -> Any:
        from aiokafka.errors import KafkaError

        deadline = time.monotonic() + self._retry_s
        attempt = 0
        while True:
            try:
                return await op()
            except (KafkaError, OSError) as exc:
                retriable = (
                    isinstance(exc, OSError) or bool(getattr(exc, "retriable", False)) or _is_timeout(exc)
                )
                if not retriable or time.monotonic() >= deadline:
                    raise
                delay = _RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)]
                attempt += 1
                with self._cond:
                    self._stats["retries"] += 1
                if self.metrics is not None:
                    self.metrics.retries.inc()
                log.warning(
                    "Kafka send failed, retrying",
                    extra={"what": what, "error": _describe(exc), "attempt": attempt},
                )
                await asyncio.sleep(delay)

    def _shutdown(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            if self._state is not PublisherState.FAILED:
                self._state = PublisherState.CLOSED
            self._cond.notify_all()
        pub = self._pub
        if pub is not None:
            with contextlib.suppress(Exception):
                self._call(pub.stop(), 30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30.0)
        if not self._thread.is_alive():
            self._loop.close()


def _is_timeout(exc: BaseException) -> bool:
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, RequestTimedOutError

    return isinstance(exc, (KafkaTimeoutError, RequestTimedOutError, KafkaConnectionError))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
