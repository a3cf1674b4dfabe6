"""PS SavedModels: one shard's rows of every table in core-TF ``MutableHashTable``s, with the manifest signatures.

Signatures (names from :mod:`schemas.manifest`): ``lookup``, ``upsert_<t>``, ``delete_<t>``, ``row_count``. The table
rows are saved in the SavedModel's checkpoint (``variables/``) and restored when the model is loaded, whether by
``tf.saved_model.load`` or by ``tensorflow_model_server``'s TF1 loader; the write signatures mutate the loaded
table in place, so successive Predict calls see earlier writes. Only core TF ops.
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
    TableSpec,
    delete_signature,
    lookup_ids_input,
    lookup_values_output,
    row_count_output,
    upsert_signature,
)

__all__ = ["ArtifactError", "check_saved_model_dir", "read_ps_tables", "write_ps_shard"]

Rows = tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]


class ArtifactError(ValueError):
    """A missing, half-written or foreign artifact directory; the message names the directory and the problem."""


def write_ps_shard(path: str | Path, tables: Sequence[TableSpec], rows: Mapping[str, Rows]) -> None:
    """Save one PS shard at ``path`` (must not exist): ``rows[t.name]`` = (ids int64 [n], values float32 [n, dim])."""
    import tensorflow as tf

    module = tf.Module()
    module.tables = {}
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
    signatures = _signatures(module.tables, tables)
    tf.saved_model.save(module, str(path), signatures=signatures)


def _signatures(tables: Mapping[str, Any], specs: Sequence[TableSpec]) -> dict[str, Any]:
    import tensorflow as tf

    names = [s.name for s in specs]

    def lookup(*ids: Any) -> dict[str, Any]:
        return {lookup_values_output(t): tables[t].lookup(i) for t, i in zip(names, ids, strict=True)}

    def row_count() -> dict[str, Any]:
        return {row_count_output(t): tables[t].size() for t in names}

    sigs: dict[str, Any] = {
        LOOKUP_SIGNATURE: tf.function(
            lookup, input_signature=[tf.TensorSpec([None], tf.int64, name=lookup_ids_input(t)) for t in names]
        ),
        ROW_COUNT_SIGNATURE: tf.function(row_count, input_signature=[]),
    }
    for spec in specs:
        table = tables[spec.name]

        def upsert(ids: Any, values: Any, table: Any = table) -> dict[str, Any]:
            # The last occurrence of an id wins: keep, per unique id, the row of its highest index.
            uniq, idx = tf.unique(ids)
            last = tf.math.unsorted_segment_max(tf.range(tf.size(ids)), idx, tf.size(uniq))
            table.insert(uniq, tf.gather(values, last))
            return {"rows": table.size()}

        def delete(ids: Any, table: Any = table) -> dict[str, Any]:
            table.remove(ids)
            return {"rows": table.size()}

        sigs[upsert_signature(spec.name)] = tf.function(
            upsert,
            input_signature=[
                tf.TensorSpec([None], tf.int64, name="ids"),
                tf.TensorSpec([None, spec.dim], tf.float32, name="values"),
            ],
        )
        sigs[delete_signature(spec.name)] = tf.function(
            delete, input_signature=[tf.TensorSpec([None], tf.int64, name="ids")]
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
