"""Exports a trainer makes: with the stream cut recorded, and entry-only refreshes of the dense weights.

:func:`export_with_cut` is :func:`embedgate.export.exporter.export_model` for a model whose rows a
:class:`~embedgate.train.RowPublisher` streams: it flushes the publisher (every row published so far is acknowledged,
and the model's tables hold them), reads the end offsets of the delta topic (the stream cut,
:mod:`embedgate.export.streamcut`) and exports with it, so a replica that loads the new version resumes from the cut
instead of replaying the partition. Call it between training steps (the tables must not change while it runs).

:func:`refresh_entry` is :func:`embedgate.export.entry_refresh.export_entry`: a new entry version with the current
dense weights, running with the current PS version (``embedgate export --entry-only``); ``StreamRows(...,
entry_every_s=...)`` calls it right after a row publish was acknowledged.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedgate.train.publisher import RowPublisher

if TYPE_CHECKING:
    from embedgate.export.exporter import ExportResult

__all__ = ["export_with_cut", "refresh_entry"]


def export_with_cut(
    model: Any,
    declaration: Any,
    out_dir: str | Path,
    publisher: RowPublisher,
    *,
    topics: list[str] | None = None,
    flush_timeout_s: float | None = 300.0,
    kafka_timeout_s: float = 60.0,
    **export_kwargs: Any,
) -> ExportResult:
    """Flush ``publisher``, read the stream cut of ``topics`` (default: the publisher's topic, the model's own
    ``embedgate.deltas.<model>``) and export ``model`` with it; returns the ``ExportResult``. Raises what
    :meth:`RowPublisher.flush` raises (nothing is exported then) and aiokafka's ``KafkaError`` / ``TimeoutError``
    when the cut cannot be read."""
    from embedgate.export.exporter import export_model
    from embedgate.export.streamcut import kafka_stream_cut

    publisher.flush(flush_timeout_s)
    cut, _missing = kafka_stream_cut(
        publisher.bootstrap,
        topics or [publisher.topic],
        security=publisher.security,
        timeout_s=kafka_timeout_s,
    )
    return export_model(model, declaration, out_dir, stream_cut=cut, **export_kwargs)


def refresh_entry(
    model: Any,
    declaration: Any,
    out_dir: str | Path,
    *,
    self_check: bool = True,
    keep_entry_versions: int = 3,
) -> Any:
    """Write a new entry version of the model exported under ``out_dir`` with ``model``'s dense weights; returns the
    ``ExportResult`` (``manifest.ps_version``: the PS version it runs with). ``ExportError`` when the tables, dims,
    partitioning or lookup vocabularies differ from the PS version's."""
    from embedgate.export.entry_refresh import export_entry

    return export_entry(
        model, declaration, out_dir, self_check=self_check, keep_entry_versions=keep_entry_versions
    )
