"""Export a trained Keras model as Monolith-style serving artifacts: ``entry`` + ``ps_0..ps_N-1`` + manifest.

::

    <out>/<model>/manifest.json
    <out>/<model>/entry/<version>/      SavedModel, signature serving_default: pooled sparse + dense -> outputs
    <out>/<model>/ps_<i>/<version>/     SavedModel, core-TF hash tables with shard i's rows of every table
    <out>/<model>/example_request.json  a REST predict body: ids sampled from the exported rows (gateway /docs)

The entry model is the sub-graph of the Keras model from the declared pooled tensors and dense inputs to the
outputs. Writing is atomic: everything is built in a hidden temp directory next to the destination and renamed into
place at the end (the whole model directory in one rename when it is new; otherwise one rename per version
directory, rolled back on failure), so no reader ever sees a half-written version directory.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard, get_args

import numpy as np
import numpy.typing as npt

from embedgate.export.declaration import Declaration, DeclarationError, load_declaration
from embedgate.export.ps import Rows, write_ps_shard
from embedgate.export.tables import TableFileError, check_rows, load_table
from embedgate.export.warmup import write_warmup
from gateway.lookup_mapping import LOOKUPS_FILE, LookupKind, LookupMapping, dump_lookups
from schemas.manifest import (
    EXAMPLE_REQUEST_FILE,
    MANIFEST_FILE,
    DenseFeatureSpec,
    EntryInputMode,
    EntryRowDtype,
    EntrySpec,
    FeatureKind,
    Manifest,
    OutputSpec,
    PartitionSpec,
    PsLayout,
    SparseFeatureSpec,
    TableSpec,
    ps_dir_name,
)
from schemas.partition import shard_for

__all__ = [
    "ExportError",
    "ExportResult",
    "check_stream_cut",
    "export_model",
    "next_version",
    "write_artifacts",
]

ENTRY_DIR = "entry"
_MODEL_FILES = (LOOKUPS_FILE,)  # model-level files that follow the newest version, next to the manifest
_VARIABLE_SAMPLE_LENGTH = 8  # most ids per self-check example of a variable-length feature without max_ids
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# The dtypes `OutputSpec.dtype` accepts.
_OutputDtype = Literal["float32", "float64", "int32", "int64"]


def _is_output_dtype(dtype: str) -> TypeGuard[_OutputDtype]:
    return dtype in get_args(_OutputDtype)


class ExportError(ValueError):
    """The export cannot proceed (e.g. the version exists); the message names the path and the problem."""


@dataclass(frozen=True)
class ExportResult:
    model_dir: Path  # <out>/<model>
    version: int
    manifest: Manifest
    # the self-check's largest absolute prediction error against the model (None: no self-check ran)
    max_error: float | None = None
    self_check: Any = None  # selfcheck.SelfCheckReport of the export (None: no self-check ran)


@dataclass
class _Plan:
    tables: list[TableSpec]
    rows: dict[str, Rows]
    sparse: list[SparseFeatureSpec]
    dense: list[DenseFeatureSpec]
    entry: Any  # keras.Model
    outputs: list[OutputSpec]
    reference: Any = None  # selfcheck.Reference
    # table -> ids the self-check samples from
    sample_ids: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)  # multi feature -> the model's padded length
    raw_samples: dict[str, list[Any]] = field(default_factory=dict)  # feature behind a lookup -> raw values
    mappings: dict[str, LookupMapping] = field(default_factory=dict)  # feature behind a lookup -> its mapping


def export_model(
    model: Any,
    declaration: Declaration | str | Path,
    out_dir: str | Path,
    *,
    num_shards: int = 2,
    version: int | None = None,
    overwrite: bool = False,
    tables: Mapping[str, Rows | str | Path] | None = None,
    self_check: bool = True,
    stream_cut: Mapping[str, int] | None = None,
    ps_layout: PsLayout = PsLayout.SLAB,
    entry_input: EntryInputMode | str = EntryInputMode.UNIQUE_ROWS,
    entry_row_dtype: EntryRowDtype | str = EntryRowDtype.FLOAT32,
) -> ExportResult:
    """Export ``model`` (a keras.Model or a ``.keras`` file) as ``<out_dir>/<model_name>/``.

    ``version`` None = one more than the highest existing version (1 for a new model). An existing version is
    refused unless ``overwrite``. ``tables`` replaces the rows of named tables (instead of the Embedding layer's
    weights) with ``(ids, vectors)`` arrays or an HPS table directory, so tables trained elsewhere can be served.
    ``self_check``: before publishing, run the staged entry + PS on sample inputs and compare with the Keras model
    (:mod:`embedgate.export.selfcheck`); a mismatch raises ``SelfCheckError`` and publishes nothing.
    ``stream_cut`` (``"<topic>:<partition>"`` -> next offset, :mod:`embedgate.export.streamcut`): the Kafka position
    the model's tables contain; every PS table starts there and ``manifest.json`` records it (None: no cut, replicas
    start without a position and an updater replays their partitions from the beginning).
    ``ps_layout``: how the PS shards hold rows (:mod:`embedgate.export.ps`); ``hash`` is the layout of earlier
    releases, kept for one release, and takes no ``row_dtype`` / ``ttl_s``.
    ``entry_input``: ``unique_rows`` (default: the entry takes each distinct row once per table plus indices and
    pools in its own graph, :mod:`embedgate.export.entry_graph`) or ``pooled`` (one pooled row per feature, pooled by
    the gateway); ``entry_row_dtype`` (``unique_rows`` only): the rows' dtype on the wire (float32, bfloat16,
    float16), cast to float32 by the entry before pooling. ``ExportResult.max_error`` is the self-check's largest
    prediction error against the model.
    """
    decl = declaration if isinstance(declaration, Declaration) else load_declaration(declaration)
    if num_shards < 1:
        raise ExportError(f"num_shards must be >= 1, got {num_shards}")
    cut = check_stream_cut(stream_cut)
    keras_model = _load_model(model)
    plan = _plan(keras_model, decl, tables or {})
    del keras_model
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


def _entry_spec(
    outputs: list[OutputSpec], entry_input: EntryInputMode | str, entry_row_dtype: EntryRowDtype | str
) -> EntrySpec:
    try:
        mode, row_dtype = EntryInputMode(entry_input), EntryRowDtype(entry_row_dtype)
    except ValueError as exc:
        raise ExportError(f"entry input: {exc}") from None
    if mode is EntryInputMode.POOLED and row_dtype is not EntryRowDtype.FLOAT32:
        raise ExportError(
            f"entry_row_dtype {row_dtype.value} needs the unique_rows entry input (a pooled entry takes float32)"
        )
    return EntrySpec(outputs=outputs, input_mode=mode, row_dtype=row_dtype)


def _export_plan(
    plan: _Plan,
    decl: Declaration,
    out_dir: str | Path,
    num_shards: int,
    version: int | None,
    overwrite: bool,
    self_check: bool,
    stream_cut: Mapping[str, int] | None = None,
    ps_layout: PsLayout = PsLayout.SLAB,
    *,
    entry_input: EntryInputMode | str = EntryInputMode.UNIQUE_ROWS,
    entry_row_dtype: EntryRowDtype | str = EntryRowDtype.FLOAT32,
) -> ExportResult:
    model_dir = Path(out_dir) / decl.model_name
    layout = PsLayout(ps_layout)
    if layout is PsLayout.HASH:
        for t in plan.tables:
            if t.row_dtype != "float32" or t.ttl_s is not None:
                raise ExportError(
                    f"table {t.name!r}: row_dtype / ttl_s need the slab PS layout (not --ps-layout hash)"
                )
    ver = next_version(model_dir) if version is None else version
    if ver < 1:
        raise ExportError(f"version must be >= 1, got {ver}")
    entry_spec = _entry_spec(plan.outputs, entry_input, entry_row_dtype)
    written_ms = int(time.time() * 1000)  # exported rows count as written now (ttl_s)
    manifest = Manifest(
        model_name=decl.model_name,
        version=ver,
        tables=plan.tables,
        sparse_features=plan.sparse,
        dense_features=plan.dense,
        partition=PartitionSpec(num_shards=num_shards),
        entry=entry_spec,
        ps_layout=layout,
        stream_cut=dict(stream_cut or {}),
        tensorflow_version=_tensorflow_version(),
        exported_at_ms=written_ms,
    )
    report: list[Any] = []

    def build(tmp: Path) -> None:
        _save_entry(plan.entry, manifest, tmp / ENTRY_DIR)
        shards = {t.name: shard_for(plan.rows[t.name][0], num_shards) for t in plan.tables}
        for i in range(num_shards):
            part = {}
            for t in plan.tables:
                ids, vals = plan.rows[t.name]
                sel = shards[t.name] == i
                part[t.name] = (ids[sel], vals[sel])
            write_ps_shard(
                tmp / ps_dir_name(i),
                plan.tables,
                part,
                stream_cut=stream_cut,
                layout=layout,
                written_ms=written_ms,
            )
        if self_check and plan.reference is not None:
            from embedgate.export.selfcheck import check_staged, sample_instances

            instances = sample_instances(manifest, plan.sample_ids, plan.lengths, raw=plan.raw_samples)
            report.append(
                check_staged(tmp, manifest, plan.reference, instances, plan.lengths, plan.mappings, plan.rows)
            )

    extra = {LOOKUPS_FILE: dump_lookups(list(plan.mappings.values()))} if plan.mappings else {}
    write_artifacts(model_dir, manifest, build, overwrite=overwrite, extra_files=extra)
    if _current_version(model_dir) == ver:  # the example fits the manifest the gateway reads
        tmp_req = model_dir / f".{EXAMPLE_REQUEST_FILE}.tmp"
        example = _example_request(manifest, plan.rows, raw=plan.raw_samples)
        tmp_req.write_text(json.dumps(example) + "\n", encoding="utf-8")
        tmp_req.replace(model_dir / EXAMPLE_REQUEST_FILE)
    return ExportResult(
        model_dir=model_dir,
        version=ver,
        manifest=manifest,
        max_error=max(report[0].output_error.values(), default=0.0) if report else None,
        self_check=report[0] if report else None,
    )


def _tensorflow_version() -> str:
    """``tf.__version__`` of the TensorFlow writing the SavedModels (recorded in the manifest)."""
    import tensorflow as tf

    return str(tf.__version__)


def check_stream_cut(cut: Mapping[str, int] | None) -> dict[str, int]:
    """``cut`` as a plain dict after checking it (keys ``"<topic>:<partition>"``, offsets >= 0); ExportError naming the
    bad entry."""
    out: dict[str, int] = {}
    for key, offset in (cut or {}).items():
        topic, sep, part = str(key).rpartition(":")
        if not sep or not topic or not part.isdigit():
            raise ExportError(f'stream cut: key {key!r} is not "<topic>:<partition>"')
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
            raise ExportError(f"stream cut: {key}: offset {offset!r} is not an integer >= 0")
        out[str(key)] = int(offset)
    return out


def next_version(model_dir: Path) -> int:
    """One more than the highest numeric version under ``entry`` or any ``ps_<i>`` (1 when there is none)."""
    best = 0
    if model_dir.is_dir():
        for sub in model_dir.iterdir():
            if sub.is_dir() and (sub.name == ENTRY_DIR or sub.name.startswith("ps_")):
                best = max([best] + [int(v.name) for v in sub.iterdir() if v.name.isdigit()])
    return best + 1


def write_artifacts(
    model_dir: Path,
    manifest: Manifest,
    build: Any,
    *,
    overwrite: bool = False,
    extra_files: Mapping[str, str] | None = None,
) -> None:
    """Atomically publish version ``manifest.version``: ``build(tmp)`` writes ``tmp/entry``, ``tmp/ps_<i>``.

    ``extra_files``: model-level files that describe the newest version like the manifest (``lookups.json``);
    written (each replaced atomically) just before the manifest, and only when the manifest is; a known such file
    that the new version lacks is removed.
    """
    extra_files = extra_files or {}
    ver = str(manifest.version)
    subdirs = [ENTRY_DIR] + [ps_dir_name(i) for i in range(manifest.num_shards)]
    existing = [model_dir / s / ver for s in subdirs if (model_dir / s / ver).exists()]
    if existing and not overwrite:
        raise ExportError(f"{existing[0]}: version {ver} already exists (pass overwrite=True / --overwrite)")
    parent = model_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.export-", dir=parent))
    try:
        stage = tmp / "stage"
        stage.mkdir()
        build(stage)
        write_warmup(stage, manifest)  # TF Serving replays it before a version is AVAILABLE
        if not model_dir.exists():
            # New model: lay out the whole model directory, then publish it with one rename.
            new = tmp / "model"
            new.mkdir()
            for s in subdirs:
                (new / s).mkdir()
                (stage / s).rename(new / s / ver)
            for name, text in extra_files.items():
                (new / name).write_text(text, encoding="utf-8")
            (new / MANIFEST_FILE).write_text(manifest.dumps(), encoding="utf-8")
            new.rename(model_dir)
            return
        _publish_into(model_dir, stage, subdirs, ver, tmp)
        if manifest.version >= _current_version(model_dir):
            # The manifest describes the newest version (the one TF Serving's latest policy serves).
            for name in _MODEL_FILES:
                if name not in extra_files:
                    (model_dir / name).unlink(missing_ok=True)
            for name, text in extra_files.items():
                etmp = tmp / name
                etmp.write_text(text, encoding="utf-8")
                etmp.replace(model_dir / name)
            mtmp = tmp / MANIFEST_FILE
            mtmp.write_text(manifest.dumps(), encoding="utf-8")
            mtmp.replace(model_dir / MANIFEST_FILE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _example_request(
    manifest: Manifest, rows: Mapping[str, Rows], n: int = 3, *, raw: Mapping[str, list[Any]] | None = None
) -> dict[str, Any]:
    """``{"instances": [...]}`` of ``n`` examples: ids drawn from the exported rows of each feature's table (the
    second example's multi features empty), weights in [0.5, 1.5], dense values in [0, 1). A feature behind a
    lookup layer (``raw``: feature -> vocabulary values) takes raw values from its vocabulary, as clients send them."""
    rng = np.random.default_rng(0)
    instances: list[dict[str, Any]] = []
    for k in range(n):
        inst: dict[str, Any] = {}
        for f in manifest.sparse_features:
            size = 1 if f.kind is FeatureKind.SINGLE else 0 if k == 1 else min(3, f.max_ids or 3)
            vocab = list(raw.get(f.name, []))[:-1] if raw else []  # the last sample is an OOV probe
            picked: list[Any]
            if vocab:
                picked = [vocab[int(i)] for i in rng.integers(0, len(vocab), size)]
                picked = [v if isinstance(v, str) else int(v) for v in picked]
            else:
                ids = rows[f.table][0]
                picked = [int(i) for i in rng.choice(ids, size)] if len(ids) else [0] * size
            inst[f.name] = picked[0] if f.kind is FeatureKind.SINGLE else picked
            if f.weights and k != 2:  # weights are optional: the third example leaves them out
                w = [round(float(x), 3) for x in rng.uniform(0.5, 1.5, size)]
                inst[f.weights] = w[0] if f.kind is FeatureKind.SINGLE else w
        for d in manifest.dense_features:
            inst[d.name] = [round(float(x), 3) for x in rng.uniform(0.0, 1.0, d.dim)]
        instances.append(inst)
    return {"instances": instances}


def _current_version(model_dir: Path) -> int:
    try:
        return Manifest.load(model_dir).version
    except ValueError:
        return 0


def _publish_into(model_dir: Path, stage: Path, subdirs: list[str], ver: str, tmp: Path) -> None:
    """Rename each staged version dir into place (PS first, entry last); undo everything on failure."""
    old = tmp / "old"
    old.mkdir()
    moved_old: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for s in subdirs[1:] + subdirs[:1]:
            dest = model_dir / s / ver
            dest.parent.mkdir(exist_ok=True)
            if dest.exists():
                aside = old / s
                dest.rename(aside)
                moved_old.append((aside, dest))
            (stage / s).rename(dest)
            placed.append(dest)
    except BaseException:
        for dest in placed:
            shutil.rmtree(dest, ignore_errors=True)
        for aside, dest in moved_old:
            aside.rename(dest)
        raise


# -- analysis ---------------------------------------------------------------------------------------------------
def _load_model(model: Any) -> Any:
    import keras

    import embedgate.export.layers  # noqa: F401  (registers EmbeddingPooling for deserialisation)

    if isinstance(model, (str, Path)):
        p = Path(model)
        if not p.exists():
            raise DeclarationError(f"{p}: model file does not exist")
        return keras.saving.load_model(p)
    if not isinstance(model, keras.Model):
        raise DeclarationError(f"expected a keras.Model or a .keras file, got {type(model).__name__}")
    # Cutting the entry sub-graph adds nodes to the layers it passes through, which would leave the caller's model
    # unsaveable: work on a copy (same config, same weights).
    try:
        copy = model.__class__.from_config(model.get_config())
    except Exception as exc:
        raise DeclarationError(
            f"cannot copy model {model.name!r} from its config ({exc}); register custom layers with "
            "keras.saving.register_keras_serializable or pass a .keras file"
        ) from exc
    copy.set_weights(model.get_weights())
    # An adapted IntegerLookup/StringLookup keeps its vocabulary outside its config: carry it over.
    for src, dst in zip(model.layers, copy.layers, strict=True):
        if isinstance(src, (keras.layers.IntegerLookup, keras.layers.StringLookup)):
            vocab = src.get_vocabulary(include_special_tokens=False)
            if dst.get_vocabulary(include_special_tokens=False) != vocab:
                dst.set_vocabulary(vocab)
    return copy


def _plan(model: Any, decl: Declaration, table_rows: Mapping[str, Rows | str | Path]) -> _Plan:
    import keras

    from embedgate.export.lookups import KeyedTable, find_lookup, keyed_table
    from embedgate.export.modelcheck import KerasReference, check_inputs_declared, check_pooling_layer

    inputs = {t.name: t for t in model.inputs}

    def need_input(what: str, name: str) -> Any:
        if name not in inputs:
            raise DeclarationError(
                f"{what}: {name!r} is not an input of the model (inputs: {sorted(inputs)})"
            )
        return inputs[name]

    def layer(what: str, name: str) -> Any:
        try:
            return model.get_layer(name)
        except ValueError:
            raise DeclarationError(f"{what}: the model has no layer {name!r}") from None

    table_specs: dict[str, TableSpec] = {}
    table_weights: dict[str, Any] = {}
    sparse: list[SparseFeatureSpec] = []
    entry_inputs: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    keyed: dict[str, KeyedTable] = {}
    table_lookup: dict[
        str, str | None
    ] = {}  # table -> the lookup layer in front of it (None: ids as they are)
    raw_samples: dict[str, list[Any]] = {}
    mappings: dict[str, LookupMapping] = {}
    maybe_masked: list[str] = []  # multi features over an Embedding(mask_zero=True) with padded ids
    for f in decl.sparse:
        what = f"sparse feature {f.name!r}"
        if f.pooled is None:
            raise DeclarationError(
                f"{what}: `pooled` (the layer whose output is the pooled embedding) is required"
            )
        ids_input = need_input(what, f.ids_input)
        if getattr(ids_input, "sparse", False):
            raise DeclarationError(
                f"{what}: input {f.ids_input!r} is a sparse tensor input: not supported; use a ragged input "
                "(keras.Input((None,), ragged=True)) or padded ids (keras.Input((None,)) with "
                "Embedding(mask_zero=True) or a mask/weights input)"
            )
        if getattr(ids_input, "ragged", False) and f.mask is not None:
            raise DeclarationError(
                f"{what}: a ragged input {f.ids_input!r} has no padding: declare no `mask`"
            )
        ids_shape = tuple(ids_input.shape)
        if f.kind is FeatureKind.MULTI:
            padded = ids_shape[1] if len(ids_shape) == 2 else None
            lengths[f.name] = int(padded) if padded is not None else (f.max_ids or _VARIABLE_SAMPLE_LENGTH)
        for extra in (f.weights, f.mask):
            if extra is not None:
                need_input(what, extra)
        emb = layer(what, f.table)
        if not isinstance(emb, keras.layers.Embedding):
            raise DeclarationError(
                f"{what}: layer {f.table!r} is a {type(emb).__name__}, not a keras.layers.Embedding"
            )
        lookup = find_lookup(model, f)
        lookup_name = None if lookup is None else lookup.name
        if table_lookup.setdefault(f.table, lookup_name) != lookup_name:
            raise DeclarationError(
                f"{what}: table {f.table!r} is fed through lookup layer {table_lookup[f.table]!r} by another feature "
                f"and through {lookup_name!r} by this one; a table is keyed one way"
            )
        if lookup is not None:
            kt = keyed.get(f.table) or keyed_table(f, lookup, emb)
            keyed[f.table] = kt
            raw_samples[f.name] = kt.samples
            mappings[f.name] = dataclasses.replace(kt.mapping, feature=f.name)
        dim = int(emb.output_dim)
        if f.table not in table_specs:
            tdecl = decl.tables.get(f.table)
            table_specs[f.table] = TableSpec(
                name=f.table,
                dim=dim,
                default_value=tdecl.default_value if tdecl else 0.0,
                allow_nan=tdecl.allow_nan if tdecl else False,
                row_dtype=tdecl.row_dtype if tdecl else "float32",
                ttl_s=tdecl.ttl_s if tdecl else None,
            )
            table_weights[f.table] = emb
        pooled_layer = layer(what, f.pooled)
        if len(pooled_layer._inbound_nodes) != 1:
            raise DeclarationError(
                f"{what}: pooled layer {f.pooled!r} is called {len(pooled_layer._inbound_nodes)} times; "
                "name a layer called once"
            )
        pooled = pooled_layer.output
        if isinstance(pooled, (list, tuple, dict)):
            raise DeclarationError(f"{what}: pooled layer {f.pooled!r} has several outputs")
        shape = tuple(pooled.shape)
        if len(shape) != 2 or shape[1] != dim:
            raise DeclarationError(
                f"{what}: pooled layer {f.pooled!r} outputs shape {shape}, expected (None, {dim}) to match the "
                f"dim {dim} of table {f.table!r}"
            )
        check_pooling_layer(f, pooled_layer, emb)
        if (
            f.kind is FeatureKind.MULTI
            and getattr(emb, "mask_zero", False)
            and not getattr(ids_input, "ragged", False)
            and lengths[f.name] > 1
        ):
            maybe_masked.append(f.name)
        entry_inputs[f.name] = pooled
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
    dense: list[DenseFeatureSpec] = []
    for d in decl.dense:
        t = need_input(f"dense feature {d.name!r}", d.name)
        shape = tuple(t.shape)
        if shape != (None, d.dim):
            raise DeclarationError(
                f"dense feature {d.name!r}: model input has shape {shape}, declared dim {d.dim} needs (None, {d.dim})"
            )
        entry_inputs[d.name] = t
        dense.append(DenseFeatureSpec(name=d.name, dim=d.dim))
    entry = _entry_model(model, entry_inputs)
    check_inputs_declared(model, decl)
    pads = {
        f.name: keyed[f.table].pad for f in decl.sparse if f.name in mappings and f.kind is FeatureKind.MULTI
    }
    reference = KerasReference(model, decl, {f.name: entry_inputs[f.name] for f in decl.sparse}, pads)

    rows: dict[str, Rows] = {}
    sample_ids: dict[str, npt.NDArray[np.int64]] = {}
    for name, spec in table_specs.items():
        given = table_rows.get(name)
        if name in keyed:
            if given is not None:
                raise DeclarationError(
                    f"tables: {name!r} is keyed through lookup layer {table_lookup[name]!r}; it cannot be replaced by "
                    "files (their keys would not match the lookup's)"
                )
            rows[name] = (keyed[name].keys, keyed[name].rows)
        elif given is None:
            weights = np.asarray(table_weights[name].embeddings.numpy(), dtype=np.float32)
            rows[name] = (np.arange(len(weights), dtype=np.int64), weights)
        elif isinstance(given, (str, Path)):
            keys, vectors = load_table(given)
            if vectors.shape[1] != spec.dim:
                raise TableFileError(
                    f"{Path(given)}: table {name!r} rows have dim {vectors.shape[1]}, the declaration's Embedding "
                    f"layer has dim {spec.dim}"
                )
            rows[name] = (keys, vectors)
        else:
            rows[name] = check_rows(*given, dim=spec.dim, where=f"table {name!r}")
        spec_rows = len(rows[name][0])
        table_specs[name] = spec.model_copy(update={"rows": spec_rows})
        if name in keyed:
            sample_ids[name] = keyed[name].keys
        else:
            sample_ids[name] = _sample_ids(
                reference, table_weights[name], rows[name], spec, replaced=given is not None
            )
    for name in table_rows:
        if name not in table_specs:
            raise DeclarationError(
                f"tables: {name!r} is not a declared table (tables: {sorted(table_specs)})"
            )
    masked = {
        name
        for name in maybe_masked
        if _drops_padding(reference, decl, name, sample_ids, raw_samples, pads, mappings)
    }
    sparse = [f.model_copy(update={"mask_zero": True}) if f.name in masked else f for f in sparse]
    outputs = _outputs(model)
    return _Plan(
        list(table_specs.values()),
        rows,
        sparse,
        dense,
        entry,
        outputs,
        reference,
        sample_ids,
        lengths,
        raw_samples,
        mappings,
    )


def _drops_padding(
    reference: Any,
    decl: Declaration,
    name: str,
    sample_ids: Mapping[str, npt.NDArray[np.int64]],
    raw: Mapping[str, list[Any]],
    pads: Mapping[str, Any],
    mappings: Mapping[str, LookupMapping],
) -> bool:
    """Whether the model pools feature ``name`` (a multi feature over an ``Embedding(mask_zero=True)``) without its
    padding id, as a mask-aware pooling layer does: its own pooled output for ``[v, pad]`` equals that for ``[v]``.

    ``pad`` is id 0, or the mask value of a ``Hashing`` layer (its bin 0). A feature behind an
    ``IntegerLookup``/``StringLookup`` is not masked here: its mask token is padding on the Keras side only (the
    gateway maps it to the OOV key)."""
    mapping = mappings.get(name)
    if mapping is not None and mapping.kind is not LookupKind.HASHING:
        return False
    pad = pads.get(name, 0) if mapping is not None else 0
    if pad is None:
        return False

    def value(f: Any) -> Any:
        return raw[f.name][0] if f.name in raw else int(sample_ids[f.table][0])

    base: dict[str, Any] = {}
    for f in decl.sparse:
        v = value(f)
        base[f.name] = v if f.kind is FeatureKind.SINGLE else [v]
        if f.weights:
            base[f.weights] = [1.0]
    for d in decl.dense:
        base[d.name] = [0.0] * d.dim
    target = next(f for f in decl.sparse if f.name == name)
    padded = {**base, name: [value(target), pad]}
    if target.weights:
        padded[target.weights] = [1.0, 1.0]
    pooled = reference.pooled([base, padded])[name]
    return bool(np.allclose(pooled[0], pooled[1], rtol=1e-5, atol=1e-6))


def _sample_ids(
    reference: Any, emb: Any, rows: Rows, spec: TableSpec, *, replaced: bool, count: int = 64
) -> npt.NDArray[np.int64]:
    """Ids the Keras Embedding can take (0 < id < input_dim; 0 is often padding) to sample the self-check from.

    Prefer ids that exist in the served rows. When the rows were replaced (HPS files), the Keras Embedding rows of
    the sampled ids are set to what the PS serves for them (the row, or the default row), so the comparison tests
    the split, not the difference between the tables.
    """
    keys, vecs = rows
    input_dim = int(emb.input_dim)
    lo = 1 if input_dim > 1 else 0
    inside = keys[(keys >= lo) & (keys < input_dim)]
    rng = np.random.default_rng(0)
    if len(inside):
        ids = np.unique(rng.choice(inside, min(count, len(inside)), replace=False))
    else:
        ids = np.unique(rng.integers(lo, input_dim, min(count, input_dim - lo)).astype(np.int64))
    if replaced:
        order = np.argsort(keys)
        pos = np.clip(np.searchsorted(keys[order], ids), 0, max(len(keys) - 1, 0))
        hit = keys[order][pos] == ids if len(keys) else np.zeros(len(ids), bool)
        served = np.full((len(ids), spec.dim), spec.default_value, np.float32)
        served[hit] = vecs[order[pos[hit]]]
        reference.align_rows(emb, ids, served)
    return ids.astype(np.int64)


def _entry_model(model: Any, entry_inputs: dict[str, Any]) -> Any:
    import keras

    try:
        # A list, not a dict: Keras warns when dict keys differ from the (intermediate) tensors' names.
        entry = keras.Model(
            inputs=list(entry_inputs.values()), outputs=model.outputs, name=f"{model.name}_entry"
        )
    except Exception as exc:
        raise DeclarationError(
            f"cannot cut the entry sub-graph from the pooled tensors and dense inputs to the outputs: {exc}. "
            "Every model input that reaches an output other than through a declared pooled layer must be "
            "declared as a dense feature"
        ) from exc
    for lyr in entry.layers:
        if isinstance(lyr, keras.layers.Embedding):
            raise DeclarationError(
                f"Embedding layer {lyr.name!r} is still inside the entry sub-graph: declare a sparse feature for "
                "it (and its pooled layer)"
            )
    return entry


def _outputs(model: Any) -> list[OutputSpec]:
    names = list(model.output_names)
    specs = []
    for name, t in zip(names, model.outputs, strict=True):
        if not _NAME_RE.match(name):
            raise DeclarationError(f"model output {name!r} is not a valid output name (letters, digits, _)")
        dtype = str(t.dtype)
        if not _is_output_dtype(dtype):
            raise DeclarationError(
                f"model output {name!r} has dtype {dtype}, not one of float32/float64/int32/int64"
            )
        specs.append(
            OutputSpec(name=name, dtype=dtype, shape=[-1 if s is None else int(s) for s in t.shape[1:]])
        )
    return specs


def _save_entry(entry: Any, manifest: Manifest, path: Path) -> None:
    """Save the entry SavedModel for ``manifest.entry.input_mode``: the Keras entry sub-graph behind pooled inputs,
    or behind the unique-rows gather + pooling of :mod:`embedgate.export.entry_graph`."""
    import tensorflow as tf

    from embedgate.export.entry_graph import input_specs, pooled_inputs

    dims = {t.name: t.dim for t in manifest.tables}
    dense_specs = [tf.TensorSpec([None, d.dim], tf.float32, name=d.name) for d in manifest.dense_features]
    out_names = [o.name for o in manifest.entry.outputs]
    sparse_names = [f.name for f in manifest.sparse_features]

    def run(pooled: list[Any], dense: list[Any]) -> dict[str, Any]:
        result = entry(pooled + dense, training=False)
        if not isinstance(result, (list, tuple)):
            result = [result]
        return dict(zip(out_names, result, strict=True))

    if manifest.entry.input_mode is EntryInputMode.POOLED:
        specs = [
            tf.TensorSpec([None, dims[f.table]], tf.float32, name=f.name) for f in manifest.sparse_features
        ]
        n = len(specs)

        def serve(*xs: Any) -> dict[str, Any]:
            return run(list(xs[:n]), list(xs[n:]))

    else:
        specs = input_specs(manifest)
        names = [s.name for s in specs]
        n = len(specs)

        def serve(*xs: Any) -> dict[str, Any]:
            pooled = pooled_inputs(manifest, dict(zip(names, xs[:n], strict=True)))
            return run([pooled[f] for f in sparse_names], list(xs[n:]))

    module = tf.Module()
    # Track the underlying tf.Variables explicitly (as keras.export.ExportArchive does): tracking the Keras model
    # object alone leaves them out of the checkpoint that the TF1 loader restores.
    module.entry_variables = [getattr(v, "value", v) for v in entry.variables]
    fn = tf.function(serve, input_signature=specs + dense_specs)
    tf.saved_model.save(module, str(path), signatures={"serving_default": fn})
