"""PS SavedModels: one shard's rows of every table in core-TF variables and hash tables, with the manifest signatures.

Two layouts (``Manifest.ps_layout``) answer the same signatures the same way: **slab** (the default; rows in one dense
variable per table and an id -> slot index, :mod:`embedgate.export.slab`) and **hash** (below; one
``MutableHashTable`` entry per row, kept for one release behind ``--ps-layout hash``).

Signatures (names from :mod:`schemas.manifest`): ``lookup``, ``upsert_<t>``, ``delete_<t>``, ``row_count``,
``stream_position``. The table rows are saved in the SavedModel's checkpoint (``variables/``) and restored when the
model is loaded, whether by ``tf.saved_model.load`` or by ``tensorflow_model_server``'s TF1 loader; the write
signatures mutate the loaded tables in place, so successive Predict calls see earlier writes. Only core TF ops.

Hash layout, per table three hash tables: ``tables/<t>`` (id -> float32[dim] row), ``versions/<t>`` (id -> int64[2] =
(producer timestamp ms, sequence) of the write that set the row, or of the delete that removed it: a tombstone; an
id without one, e.g. an exported row, has version (-1, -1)) and ``positions/<t>`` (``"<topic>:<partition>"`` -> next
Kafka offset whose rows this table has not applied; the export's stream cut, then moved forward by writes: only
where it is >= the writer's ``stream_expected``, and each write answers the positions it found, ``stream_previous``).
A write applies an id only if its version is >= the stored one (newest wins per row, ties to the later call);
within one call the highest (timestamp, sequence) of an id wins, ties to its last occurrence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.manifest import (
    LOOKUP_SIGNATURE,
    ROW_COUNT_SIGNATURE,
    STREAM_POSITION_SIGNATURE,
    PsLayout,
    TableSpec,
    delete_signature,
    lookup_ids_input,
    lookup_values_output,
    row_count_output,
    stream_offsets_output,
    stream_partitions_output,
    upsert_signature,
)

__all__ = ["ArtifactError", "check_saved_model_dir", "read_ps_tables", "write_ps_shard"]

Rows = tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]


class ArtifactError(ValueError):
    """A missing, half-written or foreign artifact directory; the message names the directory and the problem."""


def write_ps_shard(
    path: str | Path,
    tables: Sequence[TableSpec],
    rows: Mapping[str, Rows],
    *,
    stream_cut: Mapping[str, int] | None = None,
    layout: PsLayout = PsLayout.SLAB,
    written_ms: int = 0,
) -> None:
    """Save one PS shard at ``path`` (must not exist): ``rows[t.name]`` = (ids int64 [n], values float32 [n, dim]).

    ``stream_cut`` (``"<topic>:<partition>"`` -> next offset) is the Kafka position the rows contain: every table
    starts with it as its position, so an updater resumes a freshly loaded replica from there. ``layout``: slab or
    hash (the latter takes no ``row_dtype``/``ttl_s``). ``written_ms``: when exported rows count as written (ttl)."""
    if PsLayout(layout) is PsLayout.SLAB:
        from embedgate.export.slab import write_slab_shard

        write_slab_shard(path, tables, rows, stream_cut=stream_cut, written_ms=written_ms)
        return
    for spec in tables:
        if spec.row_dtype != "float32" or spec.ttl_s is not None:
            raise ArtifactError(f"table {spec.name!r}: row_dtype and ttl_s need the slab layout")
    import tensorflow as tf

    module = tf.Module()
    module.tables = {}
    module.versions = {}
    module.positions = {}
    cut = dict(stream_cut or {})
    for spec in tables:
        table = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            default_value=tf.fill([spec.dim], tf.constant(spec.default_value, tf.float32)),
            name=f"ps_table_{spec.name}",
        )
        ids, values = rows.get(spec.name, (np.zeros(0, np.int64), np.zeros((0, spec.dim), np.float32)))
        if len(ids):
            table.insert(tf.constant(ids, tf.int64), tf.constant(values, tf.float32))
        module.tables[spec.name] = table
        module.versions[spec.name] = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64,
            value_dtype=tf.int64,
            default_value=tf.constant(_NO_VERSION, tf.int64),
            name=f"ps_versions_{spec.name}",
        )
        positions = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.string, value_dtype=tf.int64, default_value=-1, name=f"ps_positions_{spec.name}"
        )
        if cut:
            positions.insert(tf.constant(list(cut), tf.string), tf.constant(list(cut.values()), tf.int64))
        module.positions[spec.name] = positions
    signatures = _signatures(module, tables)
    tf.saved_model.save(module, str(path), signatures=signatures)


_NO_VERSION = [-1, -1]


def winners(ids: Any, timestamps: Any, seqs: Any) -> tuple[Any, Any]:
    """(unique ids, index of each one's winning occurrence): highest (timestamp, seq), ties to the last."""
    import tensorflow as tf

    uniq, idx = tf.unique(ids)
    u = tf.size(uniq)
    pos = tf.range(tf.size(ids))
    best_ts = tf.math.unsorted_segment_max(timestamps, idx, u)
    top = tf.equal(timestamps, tf.gather(best_ts, idx))
    lowest = tf.constant(np.iinfo(np.int64).min, tf.int64)
    best_seq = tf.math.unsorted_segment_max(tf.where(top, seqs, lowest), idx, u)
    top = tf.logical_and(top, tf.equal(seqs, tf.gather(best_seq, idx)))
    last = tf.math.unsorted_segment_max(tf.where(top, pos, -1), idx, u)
    return uniq, last


def newer_versions(stored: Any, ts: Any, seq: Any) -> Any:
    """bool [u]: whether (ts, seq) of each id is >= its stored version (``stored`` int64 [u, 2])."""
    import tensorflow as tf

    stored_ts, stored_seq = tf.unstack(stored, num=2, axis=1)  # one op; two slices trace a dozen
    newer = tf.logical_or(
        tf.greater(ts, stored_ts),
        tf.logical_and(tf.equal(ts, stored_ts), tf.greater_equal(seq, stored_seq)),
    )
    return tf.reshape(newer, [-1])


def _applicable(versions: Any, ids: Any, timestamps: Any, seqs: Any) -> tuple[Any, Any, Any]:
    """The writes of one call that take effect: (ids, their positions in the call, their [n, 2] versions), one per
    id (its newest write in the call), only where that write is >= the version stored for the id."""
    import tensorflow as tf

    uniq, win = winners(ids, timestamps, seqs)
    ts, seq = tf.gather(timestamps, win), tf.gather(seqs, win)
    newer = newer_versions(tf.reshape(versions.lookup(uniq), [-1, 2]), ts, seq)
    stamps = tf.stack([tf.boolean_mask(ts, newer), tf.boolean_mask(seq, newer)], axis=1)
    return tf.boolean_mask(uniq, newer), tf.boolean_mask(win, newer), stamps


def advance_positions(positions: Any, keys: Any, offsets: Any, expected: Any) -> Any:
    """Move each ``"<topic>:<partition>"`` position forward to ``offsets`` (never back), but only where the stored
    position is >= ``expected`` (the writer covered everything from there: no gap is skipped). Returns the stored
    positions before the write, one per input key (-1 = none)."""
    import tensorflow as tf

    uniq, idx = tf.unique(keys)
    u = tf.size(uniq)
    best = tf.math.unsorted_segment_max(offsets, idx, u)
    floor = tf.math.unsorted_segment_min(expected, idx, u)
    before = tf.reshape(positions.lookup(uniq), [-1])
    positions.insert(uniq, tf.where(before >= floor, tf.maximum(before, best), before))
    return tf.gather(before, idx)


def _signatures(module: Any, specs: Sequence[TableSpec]) -> dict[str, Any]:
    import tensorflow as tf

    tables, versions, positions = module.tables, module.versions, module.positions
    names = [s.name for s in specs]

    def lookup(*ids: Any) -> dict[str, Any]:
        return {lookup_values_output(t): tables[t].lookup(i) for t, i in zip(names, ids, strict=True)}

    def row_count() -> dict[str, Any]:
        return {row_count_output(t): tables[t].size() for t in names}

    def stream_position() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for t in names:
            keys, offsets = positions[t].export()
            out[stream_partitions_output(t)] = keys
            out[stream_offsets_output(t)] = offsets
        return out

    sigs: dict[str, Any] = {
        LOOKUP_SIGNATURE: tf.function(
            lookup, input_signature=[tf.TensorSpec([None], tf.int64, name=lookup_ids_input(t)) for t in names]
        ),
        ROW_COUNT_SIGNATURE: tf.function(row_count, input_signature=[]),
        STREAM_POSITION_SIGNATURE: tf.function(stream_position, input_signature=[]),
    }
    stream_specs = [
        tf.TensorSpec([None], tf.string, name="stream_partitions"),
        tf.TensorSpec([None], tf.int64, name="stream_offsets"),
        tf.TensorSpec([None], tf.int64, name="stream_expected"),
    ]
    version_specs = [
        tf.TensorSpec([None], tf.int64, name="timestamps_ms"),
        tf.TensorSpec([None], tf.int64, name="seqs"),
    ]
    for spec in specs:
        table, version, position = tables[spec.name], versions[spec.name], positions[spec.name]

        def upsert(
            ids: Any,
            values: Any,
            timestamps_ms: Any,
            seqs: Any,
            stream_partitions: Any,
            stream_offsets: Any,
            stream_expected: Any,
            table: Any = table,
            version: Any = version,
            position: Any = position,
        ) -> dict[str, Any]:
            keep, rows, stamps = _applicable(version, ids, timestamps_ms, seqs)
            table.insert(keep, tf.gather(values, rows))
            version.insert(keep, stamps)
            previous = advance_positions(position, stream_partitions, stream_offsets, stream_expected)
            return {
                "rows": table.size(),
                "applied": tf.size(keep, out_type=tf.int64),
                "stream_previous": previous,
            }

        def delete(
            ids: Any,
            timestamps_ms: Any,
            seqs: Any,
            stream_partitions: Any,
            stream_offsets: Any,
            stream_expected: Any,
            table: Any = table,
            version: Any = version,
            position: Any = position,
        ) -> dict[str, Any]:
            gone, _, stamps = _applicable(version, ids, timestamps_ms, seqs)
            table.remove(gone)
            version.insert(gone, stamps)
            previous = advance_positions(position, stream_partitions, stream_offsets, stream_expected)
            return {
                "rows": table.size(),
                "applied": tf.size(gone, out_type=tf.int64),
                "stream_previous": previous,
            }

        sigs[upsert_signature(spec.name)] = tf.function(
            upsert,
            input_signature=[
                tf.TensorSpec([None], tf.int64, name="ids"),
                tf.TensorSpec([None, spec.dim], tf.float32, name="values"),
                *version_specs,
                *stream_specs,
            ],
        )
        sigs[delete_signature(spec.name)] = tf.function(
            delete,
            input_signature=[tf.TensorSpec([None], tf.int64, name="ids"), *version_specs, *stream_specs],
        )
    return sigs


def check_saved_model_dir(path: str | Path) -> Path:
    """Raise :class:`ArtifactError` unless ``path`` is a complete SavedModel version directory."""
    p = Path(path)
    if not p.is_dir():
        raise ArtifactError(f"{p}: version directory is missing")
    if not (p / "saved_model.pb").is_file():
        raise ArtifactError(f"{p}: no saved_model.pb (half-written or not a SavedModel version directory)")
    if not (p / "variables" / "variables.index").is_file():
        raise ArtifactError(f"{p}: no variables/variables.index (half-written SavedModel)")
    return p


def read_ps_tables(shard_dirs: Sequence[str | Path], specs: Sequence[TableSpec]) -> dict[str, Rows]:
    """The rows every table was exported with, gathered over the given PS version directories (from checkpoints).

    Rows written later through ``upsert_*`` live only in the serving process and are not included.
    """
    import tensorflow as tf

    parts: dict[str, list[Rows]] = {s.name: [] for s in specs}
    for d in shard_dirs:
        p = check_saved_model_dir(d)
        try:
            reader = tf.train.load_checkpoint(str(p / "variables" / "variables"))
        except Exception as exc:
            raise ArtifactError(f"{p}: cannot read the checkpoint: {exc}") from exc
        have = reader.get_variable_to_shape_map()
        for s in specs:
            if f"slabs/{s.name}/.ATTRIBUTES/VARIABLE_VALUE" in have:
                from embedgate.export.slab import read_slab_rows

                try:
                    parts[s.name].append(read_slab_rows(reader, s, str(p)))
                except ValueError as exc:
                    raise ArtifactError(str(exc)) from exc
                continue
            kk = f"tables/{s.name}/.ATTRIBUTES/table-keys"
            vk = f"tables/{s.name}/.ATTRIBUTES/table-values"
            if kk not in have or vk not in have:
                raise ArtifactError(f"{p}: table {s.name!r} is not in this PS SavedModel")
            values = reader.get_tensor(vk).astype(np.float32)
            if values.ndim != 2 or values.shape[1] != s.dim:
                raise ArtifactError(
                    f"{p}: table {s.name!r} has rows of shape {values.shape[1:]}, expected ({s.dim},)"
                )
            parts[s.name].append((reader.get_tensor(kk).astype(np.int64), values))
    out: dict[str, Rows] = {}
    for s in specs:
        ks = [k for k, _ in parts[s.name]]
        vs = [v for _, v in parts[s.name]]
        keys = np.concatenate(ks) if ks else np.zeros(0, np.int64)
        vals = np.concatenate(vs) if vs else np.zeros((0, s.dim), np.float32)
        order = np.argsort(keys, kind="stable")
        out[s.name] = (keys[order], vals[order])
    return out
