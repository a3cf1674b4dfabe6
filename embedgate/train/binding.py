"""Which Keras Embedding row is which PS key: a trained model bound to the manifest it was exported with.

Mapped as the exporter maps them (:mod:`embedgate.export.exporter`, :mod:`embedgate.export.lookups`): every table of
the manifest is the ``keras.layers.Embedding`` layer of the same name; a plain table's row ``i`` is PS key ``i``; a
table behind a ``StringLookup`` / ``IntegerLookup`` / ``Hashing`` layer (named in ``lookups.json``) has the keys the
exporter gave it (:func:`embedgate.export.lookups.keyed_table`: vocabulary entries by raw value, the OOV row under
``OOV_KEY``, bins for ``Hashing``), and its other rows (the mask token's) are not served.

:func:`bind_model` refuses, with :class:`ModelMismatchError` naming the table or layer: a table with no Embedding
layer of its name, another dim, an Embedding layer that is not a table of the manifest, a lookup layer missing or of
another kind, a vocabulary other than the exported one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.lookup_mapping import LookupKind, LookupMapping
from schemas.manifest import Manifest

__all__ = ["ModelMismatchError", "TableBinding", "bind_model"]

NO_KEY = np.iinfo(np.int64).max  # the key of an Embedding row that is not served (a lookup's mask token row)


class ModelMismatchError(ValueError):
    """The model does not match the manifest; the message names the table or layer and what differs."""


@dataclass(frozen=True)
class TableBinding:
    """One manifest table and the model's Embedding layer holding it. ``key_of_row[i]`` is the PS key of the
    layer's row ``i`` (``NO_KEY``: not served); ``mapping`` is the lookup in front of the table (None: plain)."""

    table: str
    layer: Any  # keras.layers.Embedding
    key_of_row: npt.NDArray[np.int64]
    mapping: LookupMapping | None

    def weights(self, *, copy: bool = True) -> npt.NDArray[np.float32]:
        """The layer's table now, float32 [rows, dim]: a writable copy, or (``copy=False``) an array to read only."""
        now = self.layer.embeddings.numpy()
        return np.array(now, dtype=np.float32, copy=True) if copy else np.asarray(now, dtype=np.float32)

    def served(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(the rows of ``rows`` that are served, their PS keys)."""
        keys = self.key_of_row[rows]
        keep = keys != NO_KEY
        return rows[keep], keys[keep]


def bind_model(model: Any, manifest: Manifest, lookups: dict[str, LookupMapping]) -> list[TableBinding]:
    """The binding of every table of ``manifest`` in the Keras ``model`` (``lookups``: feature -> mapping, as read
    from ``lookups.json``); :class:`ModelMismatchError` when they do not match."""
    import keras

    layers = {layer.name: layer for layer in model.layers}
    tables = {t.name for t in manifest.tables}
    for layer in model.layers:
        if isinstance(layer, keras.layers.Embedding) and layer.name not in tables:
            raise ModelMismatchError(
                f"Embedding layer {layer.name!r} is not a table of model {manifest.model_name!r} (tables: "
                f"{', '.join(sorted(tables))})"
            )
    out = []
    for spec in manifest.tables:
        emb = layers.get(spec.name)
        if emb is None:
            raise ModelMismatchError(f"table {spec.name!r}: the model has no layer {spec.name!r}")
        if not isinstance(emb, keras.layers.Embedding):
            raise ModelMismatchError(
                f"table {spec.name!r}: layer {spec.name!r} is a {type(emb).__name__}, not a keras.layers.Embedding"
            )
        if int(emb.output_dim) != spec.dim:
            raise ModelMismatchError(
                f"table {spec.name!r}: Embedding layer {spec.name!r} has dim {emb.output_dim}, the manifest {spec.dim}"
            )
        features = [f for f in manifest.sparse_features if f.table == spec.name]
        mapping = next((lookups[f.name] for f in features if f.name in lookups), None)
        if mapping is None:
            key_of_row = np.arange(int(emb.input_dim), dtype=np.int64)
        else:
            feature = next(f for f in features if f.name in lookups)
            key_of_row = _keyed_rows(spec.name, feature, mapping, layers, emb)
        out.append(TableBinding(spec.name, emb, key_of_row, mapping))
    return out


def _keyed_rows(table: str, feature: Any, mapping: LookupMapping, layers: dict[str, Any], emb: Any) -> Any:
    """``key_of_row`` of a table behind ``mapping``'s lookup layer, as the exporter keyed it."""
    import keras

    from embedgate.export.declaration import DeclarationError, SparseDecl
    from embedgate.export.lookups import keyed_table

    lookup = layers.get(mapping.layer)
    kinds = {
        LookupKind.STRING: keras.layers.StringLookup,
        LookupKind.INTEGER: keras.layers.IntegerLookup,
        LookupKind.HASHING: keras.layers.Hashing,
    }
    want = kinds[mapping.kind]
    if lookup is None or not isinstance(lookup, want):
        got = "no such layer" if lookup is None else f"a {type(lookup).__name__}"
        raise ModelMismatchError(
            f"table {table!r}: lookups.json puts {want.__name__} layer {mapping.layer!r} in front of it; the model "
            f"has {got}"
        )
    decl = SparseDecl(name=feature.name, table=table, kind=feature.kind)
    try:
        keyed = keyed_table(decl, lookup, emb)
    except DeclarationError as exc:
        raise ModelMismatchError(f"table {table!r}: {exc}") from None
    if dataclasses.replace(keyed.mapping, feature=mapping.feature) != mapping:
        raise ModelMismatchError(
            f"table {table!r}: lookup layer {mapping.layer!r} does not map values as the exported lookups.json does "
            "(another vocabulary, bin count or mask): its rows would land under other keys; export the model again"
        )
    assert keyed.index is not None
    key_of_row = np.full(int(emb.input_dim), NO_KEY, np.int64)
    key_of_row[keyed.index] = keyed.keys
    return key_of_row
