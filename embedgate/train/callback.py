"""``StreamRows``: a Keras callback that streams the rows training changed to the served model.

Every ``every_n_batches`` training batches and/or every ``every_s`` seconds (checked at batch ends; with neither
given, every second: :data:`DEFAULT_EVERY_S`), and at the end of every epoch and of training, the callback diffs each table of the manifest against its own snapshot of what it
last published (:func:`embedgate.train.changed_rows`, bit for bit) and publishes exactly the rows that differ, under
the keys the exporter gave them (:mod:`embedgate.train.binding`), through a :class:`~embedgate.train.RowPublisher`.
Rows an optimizer moves without a gradient (Adam's and Adagrad's slots, momentum) are included: the diff sees every
change, whatever made it. The first snapshot is taken when the model is bound; ``publish_all_first=True`` instead
publishes every served row once at the first publish (for a served model exported from other weights).

``entry_every_s`` (with ``declaration`` and ``export_root``): every so often the callback also writes a new entry
version with the current dense weights (:func:`embedgate.train.refresh_entry`, ``embedgate export --entry-only``),
right after a row publish was acknowledged, so the PS already holds the rows the new entry was trained with.

The model is bound at construction when ``model`` is given, else when Keras sets it (the start of ``fit``); a model
that does not match the manifest raises :class:`~embedgate.train.ModelMismatchError` naming the table or layer,
before any training step. A Kafka failure surfaces as :class:`~embedgate.train.PublishError` from the batch end that
follows it (so ``fit`` stops).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Final

import keras
import numpy as np
import numpy.typing as npt

from embedgate.train.binding import TableBinding, bind_model
from embedgate.train.diff import changed_rows
from embedgate.train.metrics import TrainerMetrics
from embedgate.train.publisher import RowPublisher

__all__ = ["StreamRows"]

log = logging.getLogger("embedgate.train")


DEFAULT_EVERY_S: Final = 1.0
"""Publish cadence when neither ``every_n_batches`` nor ``every_s`` is given: a diff and publish per second bounds
the cost (every batch cost 1.73x a demo training step at batch 1024, every 10 batches 1.025x; docs/benchmarks.md)
and keeps rows within the 2 s publish -> served target."""


class StreamRows(keras.callbacks.Callback):  # type: ignore[misc]  # Keras ships no types: subclassing Any
    """Publish the rows training changed, for every table of the model exported to ``manifest_dir``.

    ``publisher``: an open :class:`RowPublisher` to use; else one is created from ``bootstrap`` and the
    ``publisher_kwargs`` (close it with :meth:`close`, or use the callback as a context manager). ``metrics_port``
    (off by default): serve the publisher's :class:`~embedgate.train.TrainerMetrics` on ``127.0.0.1:<port>/metrics``
    (0: a free port, then in :attr:`metrics_port`). The end of ``fit``
    publishes and flushes (every row is acknowledged when ``fit`` returns); the publisher stays open for the next. ``log_every``: one INFO line
    (rows, bytes, blocked time, lag) every that many publishes (0: never).
    """

    def __init__(
        self,
        manifest_dir: str | Path,
        bootstrap: str = "127.0.0.1:9092",
        *,
        every_n_batches: int | None = None,
        every_s: float | None = None,
        model: Any = None,
        publisher: RowPublisher | None = None,
        publish_all_first: bool = False,
        entry_every_s: float | None = None,
        declaration: Any = None,
        export_root: str | Path | None = None,
        flush_timeout_s: float | None = 300.0,
        log_every: int = 100,
        metrics_port: int | None = None,
        **publisher_kwargs: Any,
    ) -> None:
        super().__init__()
        if every_n_batches is None and every_s is None:
            every_s = DEFAULT_EVERY_S
        if every_n_batches is not None and every_n_batches < 1:
            raise ValueError(f"every_n_batches must be >= 1, got {every_n_batches}")
        if entry_every_s is not None and (declaration is None or export_root is None):
            raise ValueError("entry_every_s needs declaration= (the export declaration) and export_root=")
        self.manifest_dir = Path(manifest_dir)
        self.every_n_batches = every_n_batches
        self.every_s = every_s
        self.entry_every_s = entry_every_s
        self.declaration = declaration
        self.export_root = None if export_root is None else Path(export_root)
        self.flush_timeout_s = flush_timeout_s
        self.log_every = log_every
        self._publish_all_first = publish_all_first
        self._own_publisher = publisher is None
        if publisher is None:
            publisher_kwargs.setdefault("metrics", TrainerMetrics() if metrics_port is not None else None)
            publisher = RowPublisher(self.manifest_dir, bootstrap, **publisher_kwargs)
        self.publisher = publisher
        self.metrics = publisher.metrics
        self.metrics_port: int | None = None
        if metrics_port is not None:
            if self.metrics is None:
                raise ValueError("metrics_port= with a publisher built without metrics=TrainerMetrics()")
            self.metrics_port = self.metrics.serve(metrics_port)
        self._bindings: list[TableBinding] = []
        self._snapshots: dict[str, npt.NDArray[np.float32]] = {}
        self._bound: Any = None
        self._batches = 0
        self._last_publish = time.monotonic()
        self._last_entry = time.monotonic()
        self.publishes = 0
        self.rows_published = 0
        self.entry_versions: list[int] = []
        if model is not None:
            self._bind(model)

    # -- Keras hooks ----------------------------------------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        super().set_model(model)
        if model is not self._bound:
            self._bind(model)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._batches += 1
        now = time.monotonic()
        due = (self.every_n_batches is not None and self._batches % self.every_n_batches == 0) or (
            self.every_s is not None and now - self._last_publish >= self.every_s
        )
        if due:
            self.publish_now()
        if self.entry_every_s is not None and now - self._last_entry >= self.entry_every_s:
            self.refresh_entry_now()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.publish_now()

    def on_train_end(self, logs: Any = None) -> None:
        self.publish_now()
        self.publisher.flush(self.flush_timeout_s)

    # -- explicit use ---------------------------------------------------------------------------------------------
    def publish_now(self) -> int:
        """Publish every row that changed since the last publish (all tables); returns the rows queued."""
        if not self._bindings:
            raise RuntimeError("StreamRows has no model: pass model= or use it as a callback of fit")
        total = 0
        for b in self._bindings:
            now = b.weights(copy=False)  # read only: the snapshot takes copies of the changed rows
            snap = self._snapshots[b.table]
            if now.shape != snap.shape:
                raise RuntimeError(
                    f"table {b.table!r}: the Embedding changed shape {snap.shape} -> {now.shape}"
                )
            first = self._publish_all_first
            rows = np.arange(len(now), dtype=np.int64) if first else changed_rows(snap, now)
            served, keys = b.served(rows)
            if len(keys):
                self.publisher.publish_keys(b.table, keys, now[served])
            if len(rows):
                np.copyto(snap, now)  # bit for bit what was just published: unchanged rows are equal already,
                # and one copy of the table is cheaper than a gather and scatter of many rows
            total += len(keys)
        self._publish_all_first = False
        self._last_publish = time.monotonic()
        self.publishes += 1
        self.rows_published += total
        if self.log_every and self.publishes % self.log_every == 0:
            st = self.publisher.stats()
            log.info(
                "rows published",
                extra={
                    "publishes": self.publishes,
                    "rows": st.rows,
                    "bytes": st.bytes,
                    "blocked_s": round(st.blocked_s, 3),
                    "ack_lag_s": round(st.last_ack_lag_s, 3),
                    "pending_rows": st.pending_rows,
                },
            )
        return total

    def refresh_entry_now(self) -> int:
        """Publish the changed rows, wait until they are acknowledged, then write a new entry version with the
        current dense weights (:func:`embedgate.train.refresh_entry`); returns the version written."""
        from embedgate.train.export import refresh_entry

        if self.export_root is None or self.declaration is None:
            raise RuntimeError("refresh_entry_now needs declaration= and export_root=")
        self.publish_now()
        self.publisher.flush(self.flush_timeout_s)
        result = refresh_entry(self._bound, self.declaration, self.export_root)
        self._last_entry = time.monotonic()
        self.entry_versions.append(result.version)
        if self.metrics is not None:
            self.metrics.entry_refreshes.inc()
        log.info(
            "entry refreshed", extra={"version": result.version, "ps_version": result.manifest.ps_version}
        )
        return int(result.version)

    def __enter__(self) -> StreamRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close the publisher if the callback created it; stop the metrics endpoint it started."""
        try:
            if self._own_publisher:
                self.publisher.close(self.flush_timeout_s)
            else:
                self.publisher.flush(self.flush_timeout_s)
        finally:
            if self.metrics_port is not None and self.metrics is not None:
                self.metrics.close()

    # -- internals ------------------------------------------------------------------------------------------------
    def _bind(self, model: Any) -> None:
        self._bindings = bind_model(model, self.publisher.manifest, _lookups(self.manifest_dir))
        self._snapshots = {b.table: b.weights() for b in self._bindings}
        self._bound = model


def _lookups(model_dir: Path) -> Any:
    from gateway.lookup_mapping import load_lookups

    return load_lookups(model_dir if model_dir.is_dir() else model_dir.parent)
