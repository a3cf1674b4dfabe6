"""Decomposed export (HugeCTR HPS's workflow): a dense sub-model that takes pooled embeddings, plus table files.

The dense model has one input per sparse feature, named after it, taking the pooled embedding ``float32 [B, dim]``
(``dim`` = its table's), and one input per dense feature, named after it (``[B, dim]``). It becomes the entry
SavedModel unchanged; the tables (HPS directories, ``.npy`` or ``.npz``, see
:func:`embedgate.export.tables.load_table`) become the PS shards. The declaration is the usual one without
``pooled`` (there is no Keras pooling layer: the gateway pools as declared).

The self-check compares the served split with ``dense_model(pooled(tables))``, pooling in numpy as declared.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from embedgate.export.declaration import Declaration, DeclarationError, load_declaration
from embedgate.export.exporter import (
    ExportError,
    ExportResult,
    _export_plan,
    _outputs,
    _Plan,
    check_stream_cut,
)
from embedgate.export.modelcheck import DenseReference
from embedgate.export.ps import Rows
from embedgate.export.tables import check_rows, find_table, load_table
from schemas.manifest import DenseFeatureSpec, FeatureKind, PsLayout, SparseFeatureSpec, TableSpec

__all__ = ["export_decomposed"]

_DEFAULT_MULTI_LENGTH = 8  # sample length of a multi feature without max_ids


def export_decomposed(
    dense_model: Any,
    tables: str | Path | Mapping[str, Rows | str | Path],
    declaration: Declaration | Mapping[str, Any] | str | Path,
    out_dir: str | Path,
    *,
    num_shards: int = 2,
    version: int | None = None,
    overwrite: bool = False,
    self_check: bool = True,
    stream_cut: Mapping[str, int] | None = None,
    ps_layout: PsLayout = PsLayout.SLAB,
    entry_input: str = "unique_rows",
    entry_row_dtype: str = "float32",
) -> ExportResult:
    """Export ``dense_model`` (keras.Model or ``.keras`` file) + ``tables`` as ``<out_dir>/<model_name>/``.

    ``tables``: a directory holding ``<table>/`` (HPS), ``<table>.npy`` or ``<table>.npz`` for every declared table,
    or a mapping table -> ``(ids, vectors)`` or path. Versioning, atomicity and the self-check as in
    :func:`embedgate.export.exporter.export_model`, and so are ``stream_cut``, ``ps_layout``, ``entry_input`` and
    ``entry_row_dtype``.
    """
    if isinstance(declaration, Mapping):
        decl = Declaration.model_validate(declaration)
    else:
        decl = declaration if isinstance(declaration, Declaration) else load_declaration(declaration)
    if num_shards < 1:
        raise ExportError(f"num_shards must be >= 1, got {num_shards}")
    cut = check_stream_cut(stream_cut)
    model = _load(dense_model)
    rows = _rows(decl, tables)
    specs = {}
    for name, (_, vecs) in rows.items():
        t = decl.tables.get(name)
        specs[name] = TableSpec(
            name=name,
            dim=int(vecs.shape[1]),
            default_value=t.default_value if t else 0.0,
            allow_nan=t.allow_nan if t else False,
            rows=len(vecs),
            row_dtype=t.row_dtype if t else "float32",
            ttl_s=t.ttl_s if t else None,
        )
    inputs = {t.name: t for t in getattr(model, "inputs", None) or []}
    if not inputs:
        raise DeclarationError(
            f"dense model {model.name!r} has no symbolic inputs (use a functional keras.Model)"
        )
    ordered = []
    sparse = []
    for f in decl.sparse:
        what = f"sparse feature {f.name!r}"
        if f.mask is not None:
            raise DeclarationError(f"{what}: `mask` is a Keras-model input; a decomposed export has none")
        _expect(inputs, f.name, specs[f.table].dim, f"{what} (pooled embedding of table {f.table!r})")
        ordered.append(inputs[f.name])
        sparse.append(
            SparseFeatureSpec(
                name=f.name,
                table=f.table,
                kind=f.kind,
                combiner=f.combiner,
                weights=f.weights,
                max_ids=f.max_ids,
            )
        )
    dense = []
    for d in decl.dense:
        _expect(inputs, d.name, d.dim, f"dense feature {d.name!r}")
        ordered.append(inputs[d.name])
        dense.append(DenseFeatureSpec(name=d.name, dim=d.dim))
    extra = sorted(set(inputs) - {f.name for f in decl.sparse} - {d.name for d in decl.dense})
    if extra:
        raise DeclarationError(
            f"dense model input {extra[0]!r} is not declared: each input is a sparse feature's pooled embedding "
            "or a dense feature, named after it"
        )
    import keras

    entry = keras.Model(ordered, model.outputs, name=f"{model.name}_entry")
    rng = np.random.default_rng(0)
    sample_ids = {
        name: np.unique(rng.choice(keys, min(64, len(keys)), replace=False))
        if len(keys)
        else np.zeros(1, np.int64)
        for name, (keys, _) in rows.items()
    }
    lengths = {f.name: f.max_ids or _DEFAULT_MULTI_LENGTH for f in decl.sparse if f.kind is FeatureKind.MULTI}
    reference = DenseReference(model, decl, rows, {n: s.default_value for n, s in specs.items()})
    plan = _Plan(
        list(specs.values()), rows, sparse, dense, entry, _outputs(model), reference, sample_ids, lengths
    )
    return _export_plan(
        plan,
        decl,
        out_dir,
        num_shards,
        version,
        overwrite,
        self_check,
        cut,
        ps_layout,
        entry_input=entry_input,
        entry_row_dtype=entry_row_dtype,
    )


def _load(model: Any) -> Any:
    import keras

    import embedgate.export.layers  # noqa: F401  (registers embedgate layers for deserialisation)

    if isinstance(model, (str, Path)):
        p = Path(model)
        if not p.exists():
            raise DeclarationError(f"{p}: dense model file does not exist")
        return keras.saving.load_model(p)
    if not isinstance(model, keras.Model):
        raise DeclarationError(f"expected a keras.Model or a .keras file, got {type(model).__name__}")
    return model


def _rows(decl: Declaration, tables: str | Path | Mapping[str, Rows | str | Path]) -> dict[str, Rows]:
    names = list(dict.fromkeys(f.table for f in decl.sparse))
    out: dict[str, Rows] = {}
    if isinstance(tables, (str, Path)):
        for name in names:
            out[name] = load_table(find_table(tables, name))
        return out
    unknown = sorted(set(tables) - set(names))
    if unknown:
        raise DeclarationError(f"tables: {unknown[0]!r} is not a declared table (tables: {names})")
    for name in names:
        if name not in tables:
            raise DeclarationError(f"tables: no rows given for table {name!r}")
        given = tables[name]
        out[name] = load_table(given) if isinstance(given, (str, Path)) else check_rows(*given, where=name)
    return out


def _expect(inputs: Mapping[str, Any], name: str, dim: int, what: str) -> None:
    if name not in inputs:
        raise DeclarationError(
            f"{what}: the dense model has no input named {name!r} (inputs: {sorted(inputs)})"
        )
    shape = tuple(inputs[name].shape)
    if shape != (None, dim):
        raise DeclarationError(
            f"{what}: dense model input {name!r} has shape {shape}, expected (None, {dim})"
        )
    if str(inputs[name].dtype) != "float32":
        raise DeclarationError(
            f"{what}: dense model input {name!r} has dtype {inputs[name].dtype}, expected float32"
        )
